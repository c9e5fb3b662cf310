"""``posttrain train``: start Ray, run the trainer, say what happened.

A run that fails with an error whose message is complete (a :class:`~posttrain.errors.PosttrainError`,
or one of :data:`REFUSED`) ends with that message as one line on stderr and exit
code 2 (fix something, then run again) or 1 (the run broke off; the message names what resumes it).
Its traceback, and every record of posttrain's loggers while the run lasted, are in
``<run dir>/posttrain.log``; any other error is a bug and shows its traceback on the console as well.
``posttrain sft`` does the same.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from posttrain.agents.env_llm import EnvLLMError
from posttrain.agents.retriever.types import RetrieverError
from posttrain.config.schema import PosttrainConfig, TrainerConfig
from posttrain.errors import PosttrainError
from posttrain.trainer.checkpoint import CheckpointError

RUN_LOG = "posttrain.log"
# Errors of other modules whose message says what to do, beside PosttrainError's subclasses.
REFUSED = (RetrieverError, EnvLLMError, CheckpointError)  # exit 2: a setting, an input or a service to fix


def exit_code_of(err: BaseException) -> int | None:
    """2 or 1 for an error shown as one line (see the module's docstring); None for any other (a bug)."""
    if isinstance(err, PosttrainError):
        return err.exit_code
    return 2 if isinstance(err, REFUSED) else None


@contextmanager
def run_log(run_dir: Path) -> Iterator[Callable[[], None]]:
    """``<run dir>/posttrain.log`` receives posttrain's log records (INFO and up) while the run lasts;
    the console keeps WARNING and up, as Python shows them without any logging set up. Yields what
    writes the exception being handled, with its traceback, to that file alone."""
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("posttrain")
    to_file = logging.FileHandler(run_dir / RUN_LOG)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_console = logging.StreamHandler()
    to_console.setLevel(logging.WARNING)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(to_file)
    logger.addHandler(to_console)

    def keep_traceback() -> None:
        to_file.handle(logging.LogRecord(logger.name, logging.ERROR, __file__, 0, "the run stopped", None, sys.exc_info()))

    try:
        yield keep_traceback
    finally:
        for handler in (to_file, to_console):
            logger.removeHandler(handler)
        to_file.close()
        logger.setLevel(level)


def _report(err: Exception, run_dir: Path) -> int | None:
    """``err`` as one line on stderr, if its message is complete; its exit code (None: a bug, re-raise it)."""
    code = exit_code_of(err)
    if code is not None:
        print(f"posttrain: {err} [traceback: {run_dir / RUN_LOG}]", file=sys.stderr)
    return code


def run_training(config: PosttrainConfig) -> int:
    from posttrain.trainer.async_.trainer import AsyncTrainer, StopRequested
    from posttrain.trainer.sync import SyncTrainer

    console = Console()
    start = time.perf_counter()
    try:
        trainer = (AsyncTrainer if config.trainer.mode == "async" else SyncTrainer)(config)
        finished = trainer.finished()
    except (ValueError, FileNotFoundError, CheckpointError) as err:  # refused before any worker starts: say why, no traceback
        print(f"posttrain: {err}", file=sys.stderr)
        return 2
    if finished:  # nothing to train: no Ray, no workers
        console.print(f"posttrain: this run is finished: {trainer.resume_from} holds its last step ({trainer.total_steps}). To train "
                      "further raise trainer.total_training_steps (or trainer.total_epochs); to start over, "
                      "trainer.resume_mode=disable", soft_wrap=True, highlight=False)
        _export_hint(console, trainer.resume_from, trainer.run_dir)
        return 0

    def train() -> int:
        mode = f" ({config.async_.num_generators} generator(s), max staleness {config.async_.max_staleness})" if config.trainer.mode == "async" else ""
        console.print(
            f"[bold]posttrain[/] {config.algorithm.adv_estimator} on {config.actor_rollout_ref.model.path}: "
            f"{trainer.total_steps} steps{mode} → {trainer.run_dir}"
        )
        try:
            trainer.fit()
        except StopRequested:  # a graceful stop: the checkpoint is written and named
            console.print("posttrain: run the same command again to continue (trainer.resume_mode=auto)")
            return 0
        _summary(console, trainer.val_history, trainer.run_dir, time.perf_counter() - start)
        _export_hint(console, trainer.checkpoints.latest(), trainer.run_dir)
        return 0

    return _with_ray(config.trainer, trainer.run_dir, train)


def _with_ray(trainer_config: TrainerConfig, run_dir: Path, body: Callable[[], int]) -> int:
    """``body`` with Ray up and the run's log file open: a known error ends it as one line and its exit
    code (the traceback in the log file); a bug keeps its traceback. Ray is shut down either way."""
    import ray

    _start_ray(trainer_config, run_dir)
    with run_log(run_dir) as keep_traceback:
        try:
            return body()
        except Exception as err:
            keep_traceback()
            if (code := _report(err, run_dir)) is None:
                raise
            return code
        finally:
            ray.shutdown()


def _export_hint(console: Console, checkpoint: Path | None, run_dir: Path) -> None:
    """The trained policy's checkpoint and the command that makes it a Hugging Face model."""
    if checkpoint is not None:
        console.print(f"policy: {checkpoint}  (as a Hugging Face model: posttrain export {checkpoint} --out {run_dir / 'hf_model'})",
                      soft_wrap=True, highlight=False)


def run_sft(config: PosttrainConfig) -> int:
    """``posttrain sft``: supervised fine-tuning, then the policy exported for ``posttrain train``."""
    from posttrain.trainer.sft import SFTTrainer

    console = Console()
    start = time.perf_counter()
    try:
        trainer = SFTTrainer(config)
    except (ValueError, FileNotFoundError, CheckpointError) as err:  # refused before any worker starts
        print(f"posttrain: {err}", file=sys.stderr)
        return 2

    def fine_tune() -> int:
        console.print(
            f"[bold]posttrain sft[/] on {config.actor_rollout_ref.model.path}: {len(trainer.train_set)} transcripts"
            f" ({trainer.train_set.num_dropped} dropped as too long), {trainer.total_steps} steps → {trainer.run_dir}"
        )
        export = trainer.fit()
        if len(trainer.loss_history) >= 2:
            console.print(f"val/sft_loss: {trainer.loss_history[0]:.3f} → {trainer.loss_history[-1]:.3f}")
        _summary(console, trainer.validator.history if trainer.validator else [], trainer.run_dir, time.perf_counter() - start)
        console.print(f"policy: {export}  (RL from it: posttrain train actor_rollout_ref.model.path={export})")
        return 0

    return _with_ray(config.trainer, trainer.run_dir, fine_tune)


def run_evaluation(config: PosttrainConfig, checkpoint: str | None, dump_episodes: str | None = None, by: str | None = None) -> int:
    """Validation only: the configured model, or the policy of ``checkpoint``, on data.val_files.

    ``dump_episodes``: write every validation episode to this JSON-lines file (the layout
    ``posttrain sft`` reads); ``by``: also print the summary per value of ``extra_info[by]``.
    """
    import ray

    from posttrain.trainer.export import checkpoint_dir
    from posttrain.trainer.roles import start_roles
    from posttrain.trainer.sync import SyncTrainer
    from posttrain.trainer.validation import episode_rows, summarize_rows, write_jsonl

    console = Console()
    try:
        trainer = SyncTrainer(config)
    except (ValueError, FileNotFoundError) as err:
        print(f"posttrain: {err}", file=sys.stderr)
        return 2
    if trainer.data.val is None:
        console.print("posttrain: no validation data: set data.val_files (or data.builtin)")
        return 2
    _start_ray(config.trainer, None)  # an evaluation keeps the run directory's link to its training logs
    try:
        trainer.roles = start_roles(config, trainer.total_steps)
        try:
            trainer.rollout.open(trainer.roles)
            if checkpoint:
                directory = checkpoint_dir(checkpoint)
                trainer.roles.actor.load_checkpoint(str(directory / "actor"), 1)
                console.print(f"policy from {directory}")
            metrics = trainer.validator(trainer.roles)  # no step: eval writes episodes only where --dump-episodes says
        finally:
            trainer.roles.release()
            trainer.rollout.close()
    except Exception as err:  # an evaluation keeps no log file: known errors are one line, bugs keep their traceback
        if (code := exit_code_of(err)) is None:
            raise
        print(f"posttrain: {err}", file=sys.stderr)
        return code
    finally:
        ray.shutdown()
    for name, value in sorted(metrics.items()):
        console.print(f"{name}: {value:.4f}")
    rows = episode_rows(trainer.validator.last_batch, trainer.tokenizer)
    if by is not None:
        for group, summary in summarize_rows(rows, by).items():
            console.print(f"{group}: " + " · ".join(f"{name} {value:.3f}" for name, value in summary.items()), highlight=False)
    if dump_episodes:
        console.print(f"episodes: {write_jsonl(rows, dump_episodes)}")
    return 0


def _start_ray(trainer: TrainerConfig, run_dir: Path | None) -> None:
    """Join ``trainer.ray_address`` (``auto``: the running cluster) or start a local Ray with this
    machine's CPUs; with ``trainer.ray_dashboard``, start Ray's dashboard and print where it is.
    ``<run_dir>/ray_logs`` links to this Ray session's logs (each worker's stdout and stderr)."""
    import ray

    address = trainer.ray_address
    context = ray.init(address=address, include_dashboard=trainer.ray_dashboard, log_to_driver=False,
                       **({} if address else {"num_cpus": os.cpu_count()}))
    if run_dir is not None:
        _link_ray_logs(context.address_info.get("session_dir"), run_dir)
    if trainer.ray_dashboard:
        url = context.dashboard_url
        print(f"posttrain: Ray dashboard at http://{url}" if url else "posttrain: Ray dashboard did not start (is ray[default] installed?)")


def _link_ray_logs(session_dir: str | None, run_dir: Path) -> None:
    logs = Path(session_dir or "") / "logs"
    if not session_dir or not logs.is_dir():
        return  # a cluster whose head is another machine: its logs are there
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir / "ray_logs"
    if link.is_symlink():
        link.unlink()
    if not link.exists():
        link.symlink_to(logs, target_is_directory=True)


def _summary(console: Console, history: list[dict[str, float]], run_dir, seconds: float) -> None:
    """Each validation accuracy, first → last: the run's first from metrics.jsonl (a resumed run's
    own ``history`` starts at the resume), else this process's."""
    from posttrain.trainer.report import first_and_last_validation
    from posttrain.trainer.tracking import read_jsonl

    metrics_file = Path(run_dir) / "metrics.jsonl"
    if metrics_file.exists():
        endpoints = {name: (first, last) for name, ((_, first), (_, last)) in first_and_last_validation(read_jsonl(metrics_file)).items()}
    else:
        endpoints = {name: (history[0].get(name, float("nan")), value) for name, value in (history[-1] if history else {}).items() if "/acc/" in name}
    for name, (first, last) in sorted(endpoints.items()):
        console.print(f"{name}: {first:.3f} → {last:.3f}")
    console.print(f"wall time {seconds / 60:.1f} min · report: {run_dir / 'report' / 'report.md'}")
