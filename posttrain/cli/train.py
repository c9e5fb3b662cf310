"""``posttrain train``: start Ray, run the trainer, say what happened.

A run that fails with an error whose message is complete (a :class:`~posttrain.errors.PosttrainError`)
ends with that message as one line on stderr (``cli/report.py``) and exit code 2 (fix something, then
run again) or 1 (the run broke off; the message names what resumes it). Refused before Ray starts,
the error goes up to ``posttrain``'s ``main``, which reports it; once the run has started, its
traceback, and every record of posttrain's loggers while the run lasted, are in
``<run dir>/posttrain.log``; any other error is a bug and shows its traceback on the console as well.
``posttrain sft`` does the same. A person's stop (Ctrl-C, SIGTERM, ``<run dir>/STOP``) ends as a
line saying where the run is and the exact command that continues it (trainer/run.py).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from posttrain.cli.report import report_error
from posttrain.config.schema import PosttrainConfig, TrainerConfig
from posttrain.errors import PosttrainError
from posttrain.trainer.modes import training_run
from posttrain.trainer.run import Run, fit_with_restarts
from posttrain.trainer.stopping import StopSignal, Stopped

RUN_LOG = "posttrain.log"


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


def run_training(config: PosttrainConfig) -> int:
    """``posttrain train``."""
    def summary(console: Console, run: Run, seconds: float) -> None:
        _summary(console, run.val_history, run.run_dir, seconds)
        _export_hint(console, run.checkpoints.latest(), run.run_dir)

    return _run(config, lambda stop: training_run(config, stop), summary)


def run_sft(config: PosttrainConfig) -> int:
    """``posttrain sft``: supervised fine-tuning, then the policy exported for ``posttrain train``."""
    from posttrain.trainer.sft import sft_parts

    def summary(console: Console, run: Run, seconds: float) -> None:
        from posttrain.trainer.tracking import read_jsonl

        # the whole run's, from its metrics file (a resumed run's own validations start at the resume)
        metrics_file = run.run_dir / "metrics.jsonl"
        losses = ([r["metrics"]["val/sft_loss"] for r in read_jsonl(metrics_file) if "val/sft_loss" in r["metrics"]]
                  if metrics_file.exists() else run.parts.validation.loss_history)
        if len(losses) >= 2:
            console.print(f"val/sft_loss: {losses[0]:.3f} → {losses[-1]:.3f}")
        _summary(console, run.val_history, run.run_dir, seconds)
        console.print(f"policy: {run.result}  (RL from it: posttrain train actor_rollout_ref.model.path={run.result})")

    return _run(config, lambda stop: Run(sft_parts(config), stop), summary)


def _run(config: PosttrainConfig, build: Callable[[StopSignal | None], Run], summary: Callable[[Console, Run, float], None]) -> int:
    """Build the mode's run (every check that needs no worker; what it refuses goes up to ``main``),
    then fit it with Ray up, restarting it after a process that died or hung while
    ``trainer.max_restarts`` allows."""
    console = Console()
    start = time.perf_counter()
    run = build(None)
    if run.finished():  # nothing to train: no Ray, no workers
        console.print(f"posttrain: this run is finished: {run.resume_from} holds its last step ({run.total_steps}). To train "
                      f"further raise {run.parts.more_steps}; to start over, trainer.resume_mode=disable", soft_wrap=True, highlight=False)
        _export_hint(console, run.resume_from, run.run_dir)
        return 0

    def body() -> int:
        console.print(run.parts.headline)
        try:
            finished = fit_with_restarts(run, build, console)
        except Stopped as stopped:  # the attempts share the run directory, its checkpoints and the stop signal
            return _stopped(console, stopped, run)
        summary(console, finished, time.perf_counter() - start)
        return 0

    with run.stop.installed():  # also while Ray shuts down: a late Ctrl-C is not a traceback
        return _with_ray(config.trainer, run.run_dir, body)


def _stopped(console: Console, stopped: Stopped, run: Run) -> int:
    """Where a person's stop left the run, and the exact command that continues it. Exit 0 when it
    stopped at a clean point (a checkpoint holds everything trained), 130 when it stopped at once."""
    command = shlex.join(["posttrain", *sys.argv[1:]])
    if stopped.at_once:
        latest = run.checkpoints.latest()
        where = f"the last complete checkpoint is {latest}" if latest else "no checkpoint was written"
        console.print(f"posttrain: stopped at once ({stopped.reason}) after step {stopped.step} of {run.total_steps}; {where}. "
                      f"To continue: {command}", soft_wrap=True, highlight=False, markup=False)
        return 130
    if stopped.checkpoint is None:
        console.print(f"posttrain: stopped ({stopped.reason}) before the first step; nothing was trained. To start: {command}",
                      soft_wrap=True, highlight=False, markup=False)
        return 0
    console.print(f"posttrain: stopped ({stopped.reason}) after step {stopped.step} of {run.total_steps}; checkpoint "
                  f"{stopped.checkpoint}. To continue: {command}", soft_wrap=True, highlight=False, markup=False)
    return 0


def _with_ray(trainer_config: TrainerConfig, run_dir: Path, body: Callable[[], int]) -> int:
    """``body`` with Ray up and the run's log file open: a known error ends it as one line and its exit
    code (the traceback in the log file); a bug keeps its traceback. Ray is shut down either way."""
    import ray

    start_ray(trainer_config, run_dir)
    with run_log(run_dir) as keep_traceback:
        try:
            return body()
        except PosttrainError as err:
            keep_traceback()
            return report_error(err, run_dir / RUN_LOG)
        except Exception:
            keep_traceback()
            raise
        finally:
            ray.shutdown()


def _export_hint(console: Console, checkpoint: Path | None, run_dir: Path) -> None:
    """The trained policy's checkpoint and the command that makes it a Hugging Face model."""
    if checkpoint is not None:
        console.print(f"policy: {checkpoint}  (as a Hugging Face model: posttrain export {checkpoint} --out {run_dir / 'hf_model'})",
                      soft_wrap=True, highlight=False)


def start_ray(trainer: TrainerConfig, run_dir: Path | None) -> None:
    """Join ``trainer.ray_address`` (``auto``: the running cluster), else the cluster Ray's own
    ``RAY_ADDRESS`` variable names, else start a local Ray with this machine's CPUs; with
    ``trainer.ray_dashboard``, start Ray's dashboard and print where it is.
    ``<run_dir>/ray_logs`` links to this Ray session's logs (each worker's stdout and stderr)."""
    import ray

    address = trainer.ray_address or os.environ.get("RAY_ADDRESS") or None
    # no address: a new local Ray ("local"), never the last cluster a `ray start` on this machine recorded,
    # which ray.init(address=None) would join (and then refuse num_cpus)
    context = ray.init(address=address or "local", include_dashboard=trainer.ray_dashboard, log_to_driver=False,
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
    """Each validation accuracy with its 95 % interval, first → last: the run's first from metrics.jsonl (a resumed run's
    own ``history`` starts at the resume), else this process's."""
    from posttrain.trainer.report import first_and_last_validation
    from posttrain.trainer.tracking import read_jsonl

    from posttrain.trainer.intervals import with_interval

    metrics_file = Path(run_dir) / "metrics.jsonl"
    if metrics_file.exists():
        endpoints = {name: (first, last) for name, ((_, first), (_, last)) in first_and_last_validation(read_jsonl(metrics_file)).items()}
    else:
        endpoints = {name: (with_interval(history[0], name) if name in history[0] else "nan", with_interval(history[-1], name))
                     for name in (history[-1] if history else {}) if "/acc/" in name}
    for name, (first, last) in sorted(endpoints.items()):
        console.print(f"{name}: {first} → {last}", highlight=False)
    console.print(f"wall time {seconds / 60:.1f} min · report: {run_dir / 'report' / 'report.md'}")
