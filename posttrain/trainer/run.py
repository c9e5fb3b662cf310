"""The run skeleton: what every training mode does around its step, written once.

    start        the run directory (config.yaml), the seed, the workers (roles), the checkpoint to
                 continue from, the services the mode needs (its rollout's retriever and Env-LLM,
                 an asynchronous run's generators), tracking with its progress line
    validate     before training (``trainer.val_before_train``), then when the mode's validation is due
    each step    the next item of the mode's batch source → the mode's step → metrics logged once
    checkpoint   every ``trainer.save_freq`` steps and at the last: the policy (and critic), the data
                 position, the mode's own state, the random number generators
    end          the mode's finish (SFT: the export), the report; workers and services stopped
                 whatever ended the run

A mode is a :class:`RunParts`: strategies (a batch source, a step, a validation, services, state to
checkpoint, what it adds to the workers), not a subclass with hooks. ``trainer/sync.py``, ``trainer/async_/`` and
``trainer/sft.py`` build one each; ``posttrain eval`` uses the same start and stop
(:func:`workers_up`) around a single validation. The mode is picked in one place,
``trainer/modes.py``; the ``posttrain`` command's glue around a run (Ray, the closing lines) is
``cli/train.py``.

Stopping. The first Ctrl-C (or SIGTERM, or a ``<run dir>/STOP`` file) stops at the next clean point:
after the step in progress, or at once during a validation (which changes nothing); a checkpoint is
written and the command that resumes is printed. A second Ctrl-C stops at once, with no checkpoint.
Either way no traceback is shown (:class:`Stopped`; the signal and the exceptions that end a loop:
``trainer/stopping.py``). A worker that dies or hangs ends the run; the
error names the last checkpoint unless a restart will follow (``trainer.max_restarts``: the next
attempt is a new :class:`Run`, :func:`fit_with_restarts`); an error that asks for a
checkpoint first (:class:`CheckpointThenStop`, e.g. the async generators failing) gets it.
Each step's prompt ids go to ``trained_prompts.jsonl``, cut back on a resume as ``metrics.jsonl`` is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import torch
from rich.console import Console

from posttrain.config import to_yaml
from posttrain.config.schema import PosttrainConfig
from posttrain.data import PromptDataLoader
from posttrain.errors import PosttrainError, is_restartable
from posttrain.metrics import values
from posttrain.trainer import provenance
from posttrain.trainer.checkpoint import ASYNC_STATE, CheckpointError, CheckpointManager, load_rng_state, save_rng_state, step_of
from posttrain.trainer.report import FIRST_SAMPLES, Sample, load_samples, save_samples, write_report
from posttrain.trainer.roles import ModeWorkers, Roles, start_roles
from posttrain.trainer.stopping import CheckpointThenStop, DataRanOut, StopSignal, Stopped
from posttrain.trainer.tracking import Tracking, run_tracking, truncate_jsonl

STATE_FILE = "trainer_state.json"
TRAINED_PROMPTS = "trained_prompts.jsonl"  # {"step", "prompts"}: which prompts (``"<epoch>:<row>"``) each step trained
Item = TypeVar("Item")


# ---- the strategies a mode supplies ----------------------------------------------------------


class Checkpointed(Protocol):
    """State saved in ``trainer_state.json`` (JSON-ready) and restored on resume."""

    def state_dict(self) -> Mapping[str, object]: ...

    def load_state_dict(self, state: Mapping[str, object]) -> None: ...


class CheckpointFile(Protocol):
    """State that keeps a file of its own in each checkpoint (e.g. an asynchronous run's buffer)."""

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


class Service(Protocol):
    """Something the run opens once its workers are up (and restored), and closes before they stop."""

    def open(self, roles: Roles, resumed: Path | None) -> None: ...

    def close(self) -> None:
        """Idempotent: a stop closes services before its checkpoint, and the end closes them again."""
        ...


class Validation(Protocol):
    before_training: bool           # validate at step 0 (not on resume)
    history: list[dict[str, float]]  # every validation's metrics, in order
    first_samples: list[Sample]     # for the report
    last_samples: list[Sample]

    def due(self, step: int, total_steps: int) -> bool: ...

    def __call__(self, roles: Roles, step: int) -> dict[str, float]: ...


class Step(Protocol[Item]):
    def __call__(self, roles: Roles, item: Item, step: int) -> dict[str, float]:
        """Train step ``step`` (1-based) on ``item``; returns its metrics."""
        ...


@dataclass
class RunParts(Generic[Item]):
    """Everything that differs between modes."""

    headline: str                                # what the run is, printed as it starts (rich markup)
    config: PosttrainConfig                      # what the workers are built from
    total_steps: int
    batches: Callable[[], Iterator[tuple[int | None, Item]]]  # (epoch or None, item), from the restored position
    step: Step[Item]
    validation: Validation | None = None
    services: Sequence[Service] = ()             # opened in order after the resume, closed in reverse
    state: Mapping[str, Checkpointed] = field(default_factory=dict)      # in trainer_state.json, by name
    files: Mapping[str, CheckpointFile] = field(default_factory=dict)    # files of their own, by file name
    finish: Callable[[Roles], Path] | None = None  # after the last step, workers still up (SFT: the export)
    trained_prompts: Callable[[], Sequence[str]] | None = None  # the last step's prompt ids, for trained_prompts.jsonl
    rows_drawn: Callable[[], Mapping[str, tuple[int, int]]] | None = None  # per stratum: (rows drawn so far, rows)
    workers: ModeWorkers = ModeWorkers()         # the actor's importance cap, pools of the mode's own (async: the generators)
    more_steps: str = "trainer.total_training_steps (or trainer.total_epochs)"  # the settings that train a finished run further


def rows_drawn_metrics(counts: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """``training/rows_drawn``: the share of the training rows drawn at least once so far (the rows of
    dynamic sampling's extra rounds too: they were generated on); with strata, also each stratum's
    (``training/rows_drawn/<stratum>``)."""
    drawn, total = (sum(pair[i] for pair in counts.values()) for i in (0, 1))
    metrics = {"training/rows_drawn": drawn / total} if total else {}
    if len(counts) > 1:
        metrics |= {f"training/rows_drawn/{name}": d / t for name, (d, t) in counts.items() if t}
    return metrics


def steps_cut_short(section: str, asked: int | None, epochs: int, total_steps: int, rows: str = "training rows") -> str:
    """What a run's first line adds where ``{section}.total_epochs`` cut the steps asked short ("" otherwise)."""
    if not asked or total_steps >= asked:
        return ""
    return (f" ({section}.total_training_steps={asked}, but {epochs} epoch(s) of the {rows} are {total_steps} "
            f"batches: raise {section}.total_epochs for more)")


def epoch_batches(loader: PromptDataLoader, total_epochs: int) -> Iterator[tuple[int, object]]:
    """(epoch, batch) until ``total_epochs`` are read, from the loader's position (a run resumed at
    an epoch's end starts the next one)."""
    while loader.epoch < total_epochs:
        epoch = loader.epoch
        for batch in loader:
            yield epoch, batch


# ---- the skeleton ------------------------------------------------------------------------------


@contextmanager
def workers_up(config: PosttrainConfig, total_steps: int, services: Sequence[Service],
               before_services: Callable[[Roles], Path | None] = lambda roles: None, workers: ModeWorkers = ModeWorkers()) -> Iterator[Roles]:
    """The roles started (with what the mode adds, ``workers``), ``before_services`` run (the resume),
    the services opened; on the way out, whatever happened, the services closed (in reverse) and every
    worker stopped."""
    roles = start_roles(config, total_steps, workers)  # a failed start stops what it had started
    opened: list[Service] = []
    try:
        resumed = before_services(roles)
        for service in services:
            opened.append(service)  # closed even if it fails half-open (close is idempotent)
            service.open(roles, resumed)
        yield roles
    finally:
        for service in reversed(opened):
            service.close()
        roles.release()


class Run(Generic[Item]):
    def __init__(self, parts: RunParts[Item], stop: StopSignal | None = None) -> None:
        self.parts, self.config = parts, parts.config
        self.run_dir = Path(self.config.trainer.default_local_dir)
        self.total_steps = parts.total_steps
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep=self.config.trainer.max_ckpt_to_keep)
        self.stop = stop or StopSignal(self.run_dir)
        self.step = 0
        self.saved_step: int | None = None
        self.roles: Roles | None = None
        self.result: Path | None = None  # what ``finish`` returned
        self.restarts = 0  # the attempts before this one (fit_with_restarts restarts a run as a new Run), logged as run/restarts

    @cached_property
    def resume_from(self) -> Path | None:
        """The checkpoint this run continues from (``trainer.resume_mode``), found once."""
        return self.checkpoints.resolve_resume(self.config.trainer.resume_mode)

    def finished(self) -> bool:
        """The checkpoint to continue from already holds the last step: there is nothing to train."""
        return self.resume_from is not None and step_of(self.resume_from) >= self.total_steps

    @property
    def max_restarts(self) -> int:
        """``trainer.max_restarts``; unset: 2 when checkpoints are written during the run (``trainer.save_freq``), else 0."""
        trainer = self.config.trainer
        return trainer.max_restarts if trainer.max_restarts is not None else (2 if trainer.save_freq >= 1 else 0)

    def will_restart(self, err: BaseException) -> bool:
        """``err`` is (or was raised from) a process that died or hung, and restarts are left."""
        return is_restartable(err) and self.restarts < self.max_restarts

    def restart_point(self) -> Path | None:
        """The last complete checkpoint of this attempt (the one it resumed from, or saved since); None: from scratch."""
        return self.checkpoints.step_dir(self.saved_step) if self.saved_step is not None else self.resume_from

    @property
    def val_history(self) -> list[dict[str, float]]:
        return self.parts.validation.history if self.parts.validation else []

    def fit(self) -> dict[str, float]:
        """Train to ``total_steps``; returns the last validation metrics. Raises :class:`Stopped`
        when a person stopped the run (its checkpoint, if any, named)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.config))
        provenance.write(self.run_dir)  # what made it (a resumed run: what continued it)
        if self.restarts == 0:  # a restarted attempt keeps a STOP written before it: it stops at once
            self.stop.stop_file.unlink(missing_ok=True)
        torch.manual_seed(self.config.trainer.seed)
        with self.stop.installed():
            try:
                with workers_up(self.config, self.total_steps, self.parts.services, self._started, self.parts.workers) as roles:
                    self.roles = roles
                    self._train(roles)
            except PosttrainError as err:  # a dead or hung process: no checkpoint (it holds the state); say which one resumes
                if is_restartable(err) and not isinstance(err, CheckpointThenStop) and not self.will_restart(err):
                    self.checkpoints.name_the_resume(err, self.step + 1)
                raise
            finally:
                self.stop.finishing = True
        validation = self.parts.validation
        write_report(self.run_dir, *((validation.first_samples, validation.last_samples) if validation else ()))
        return self.val_history[-1] if self.val_history else {}

    def _train(self, roles: Roles) -> None:
        """The loop and the mode's finish, tracked; a person's stop, or an error that asks for one,
        gets its checkpoint here, while the workers are still up."""
        purge_step = self.step + 1 if self.resume_from is not None and self.step > 0 else 0  # from step 0: all again
        tracking = run_tracking(self.config, self.run_dir, self.total_steps, purge_step=purge_step)
        if (self.run_dir / TRAINED_PROMPTS).exists():
            truncate_jsonl(self.run_dir / TRAINED_PROMPTS, purge_step)  # as metrics.jsonl: each step once
        try:
            with self.stop.as_stopped():  # a second Ctrl-C, wherever the loop was
                self._loop(roles, tracking)
                if self.parts.finish is not None:
                    self.result = self.parts.finish(roles)
        except Stopped as stopped:
            raise self._stopped(stopped) from None
        except CheckpointThenStop as err:
            raise err.with_checkpoint(self._checkpoint_after_closing()) from err
        finally:
            tracking.close()

    def _loop(self, roles: Roles, tracking: Tracking) -> None:
        validation = self.parts.validation
        if validation is not None and validation.before_training and self.step == 0:
            tracking.log(self._validate(roles), 0)
        batches = self.parts.batches()
        while self.step < self.total_steps:
            self.stop.check(self.step)  # before the next batch is read: a checkpoint's data position is the next step's
            try:
                epoch, item = next(batches)
            except StopIteration:  # the data ran out (total_epochs) before total_steps
                self._ran_out(roles, tracking)
                return
            try:
                metrics = self.parts.step(roles, item, self.step + 1)
            except DataRanOut:
                self._ran_out(roles, tracking)
                return
            self.step += 1
            metrics["run/restarts"] = float(self.restarts)
            metrics |= values(roles.resident_memory())  # each worker process's RSS, once a step
            if epoch is not None:
                metrics["training/epoch"] = float(epoch)
            if self.parts.rows_drawn is not None:
                metrics |= rows_drawn_metrics(self.parts.rows_drawn())
            self._record_prompts()
            if validation is not None and validation.due(self.step, self.total_steps):
                try:
                    metrics |= self._validate(roles)
                except Stopped:
                    tracking.log(metrics, self.step)  # the step trained: its metrics are kept
                    raise
            tracking.log(metrics, self.step)
            if self._due(self.config.trainer.save_freq) or self.step == self.total_steps:  # the last: the run's policy
                self.save_checkpoint()

    def _ran_out(self, roles: Roles, tracking: Tracking) -> None:
        """The data ended before ``total_steps`` (DAPO's dynamic sampling reads it faster than one
        batch a step): the last step trained is validated (when validation is on and it was not yet, in a
        second record of its step) and checkpointed, as the last step always is."""
        if self.step == (step_of(self.resume_from) if self.resume_from is not None else 0):
            return  # nothing trained by this run: the checkpoint it resumed from holds its last step
        print(f"posttrain: the data ran out after step {self.step} of {self.total_steps} (trainer.total_epochs); "
              "it is the run's last")
        validation = self.parts.validation
        if validation is not None and validation.due(self.step, self.step) and not validation.due(self.step, self.total_steps):
            tracking.log(self._validate(roles), self.step)
        if self.saved_step != self.step:  # not saved already by trainer.save_freq
            self.save_checkpoint()

    def _record_prompts(self) -> None:
        if self.parts.trained_prompts is not None:
            with open(self.run_dir / TRAINED_PROMPTS, "a", encoding="utf-8") as out:
                out.write(json.dumps({"step": self.step, "prompts": list(self.parts.trained_prompts())}) + "\n")

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.total_steps)

    def _validate(self, roles: Roles) -> dict[str, float]:
        validation = self.parts.validation
        with self.stop.interruptible():
            metrics = validation(roles, self.step)
        first_samples = self.run_dir / "report" / FIRST_SAMPLES
        if len(validation.history) == 1 and (self.resume_from is None or not first_samples.exists()):
            save_samples(first_samples, validation.first_samples)  # the run's first validation, for its report
        return metrics

    # ---- stopping ----------------------------------------------------------------------------

    def _stopped(self, stopped: Stopped) -> Stopped:
        """A person's stop, with the checkpoint it leaves (none for a second Ctrl-C or before step 1)."""
        checkpoint = None
        if not stopped.at_once and self.step > 0:
            checkpoint = self.checkpoints.step_dir(self.step) if self.saved_step == self.step else self._checkpoint_after_closing()
        return Stopped(stopped.reason, self.step, checkpoint, stopped.at_once)

    def _checkpoint_after_closing(self) -> Path:
        """Services stopped first (nothing new starts, e.g. no generator takes a unit), then the checkpoint."""
        for service in reversed(self.parts.services):
            service.close()
        return self.save_checkpoint()

    # ---- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        directory = self.checkpoints.begin(self.step)
        self.roles.actor.save_checkpoint(str(directory / "actor"))
        if self.roles.critic is not None:
            self.roles.critic.save_checkpoint(str(directory / "critic"))
        state = {"step": self.step} | {name: part.state_dict() for name, part in self.parts.state.items()}
        (directory / STATE_FILE).write_text(json.dumps(state))
        (directory / "config.yaml").write_text(to_yaml(self.config))
        save_rng_state(directory)
        for name, part in self.parts.files.items():
            part.save(directory / name)
        self.saved_step = self.step
        return self.checkpoints.commit(self.step)

    def _started(self, roles: Roles) -> Path | None:
        """The workers are up: say which process is which (to find, or stop, one from outside), then resume."""
        actor = roles.actor
        (self.run_dir / "processes.json").write_text(json.dumps({"actor": actor.pid(), "actor_nodes": actor.node_id()}))
        return self._resume(roles)

    def _resume(self, roles: Roles) -> Path | None:
        """Restore the checkpoint to continue from (``trainer.resume_mode``); returns its directory, or
        None. Checkpoints after it (an earlier attempt that went further) are moved aside."""
        directory = self.resume_from
        if directory is not None and (directory / ASYNC_STATE).exists() and ASYNC_STATE not in self.parts.files:
            raise CheckpointError(
                f"{directory} was written by an asynchronous run: the prompts it had read ahead are in {ASYNC_STATE}, "
                "which only trainer.mode=async resumes (or start over: trainer.resume_mode=disable)"
            )
        self.step = self.checkpoints.continue_from(directory)
        if directory is None:
            return None
        state = json.loads((directory / STATE_FILE).read_text())
        for name, part in self.parts.state.items():
            part.load_state_dict(state[name])
        load_rng_state(directory)
        roles.actor.load_checkpoint(str(directory / "actor"), self.step)
        if roles.critic is not None:
            roles.critic.load_checkpoint(str(directory / "critic"))
        for name, part in self.parts.files.items():
            part.load(directory / name)
        if self.parts.validation is not None:
            self.parts.validation.first_samples = load_samples(self.run_dir / "report" / FIRST_SAMPLES)
        self.saved_step = self.step
        print(f"posttrain: resumed from {directory} (step {self.step})")
        return directory


# ---- restarts ----------------------------------------------------------------------------------


def fit_with_restarts(run: Run, build: Callable[[StopSignal | None], Run], console: Console) -> Run:
    """``run.fit()``; after a process that died or hung (a :class:`~posttrain.errors.ProcessLost`, or an
    error raised from one: :func:`~posttrain.errors.is_restartable`) a new attempt from the
    last complete checkpoint, while ``trainer.max_restarts`` allows and nobody asked the run to stop
    (then it stops at that checkpoint). Returns the attempt that finished; raises what ended the last
    one (its message says how many restarts came before)."""
    try:
        while True:
            try:
                run.fit()
                return run
            except PosttrainError as err:
                if run.will_restart(err) and (run.stop.requested.is_set() or run.stop.stop_file.exists()):
                    point = run.restart_point()  # a person asked to stop: no new attempt, the last checkpoint stands
                    raise Stopped(run.stop.reason or f"{run.stop.stop_file} exists", step_of(point) if point else 0, point) from err
                if not run.will_restart(err):
                    if is_restartable(err) and run.restarts:
                        err.args = (f"{err} This was after {run.restarts} restart(s), the most trainer.max_restarts={run.max_restarts} allows.",)
                    raise
                run = _restarted(run, err, build, console)
    except Stopped as stopped:
        if stopped.step < 0:  # stopped at once outside a step (while workers started): say this attempt's step
            raise Stopped(stopped.reason, run.step, stopped.checkpoint, stopped.at_once) from None
        raise


def _restarted(run: Run, err: PosttrainError, build: Callable[[StopSignal | None], Run], console: Console) -> Run:
    """The next attempt after ``err`` (its workers are already stopped): a run built as the first
    was, continuing from the last complete checkpoint, with the same stop signal (Ctrl-C works on)."""
    point = run.restart_point()
    attempt = run.restarts + 1
    logging.getLogger("posttrain").info("restart %d of %d after: %s", attempt, run.max_restarts, err, exc_info=err)  # the log file only
    where = f"from {point}" if point else "from the start (no checkpoint yet)"
    console.print(f"posttrain: restart {attempt} of {run.max_restarts} (trainer.max_restarts): {err} Starting the workers again, {where}.",
                  soft_wrap=True, highlight=False, markup=False)
    run.stop.finishing = False
    fresh = build(run.stop)
    fresh.resume_from = point  # not trainer.resume_mode: this attempt's own last checkpoint
    fresh.restarts = attempt
    return fresh
