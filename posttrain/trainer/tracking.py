"""Where metrics go: console (a live progress bar), JSONL, TensorBoard, Weights & Biases (offline),
MLflow (local file store). Chosen by name from ``trainer.logger``; every tracker takes the same flat
``{name: number}`` dict per step, with verl's namespaced names (``critic/score/mean``, ``timing_s/gen``).

No step is recorded twice. A run resumed from step k (or started again from scratch) passes
``purge_step`` k + 1 (or 0): ``metrics.jsonl`` loses its records of that step and later (the steps
of an attempt that went on past its last checkpoint) and TensorBoard hides them (its own
``purge_step``). Weights & Biases and MLflow start a new run each time the trainer starts, so each of
their runs holds every step once.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from posttrain.errors import InputError

# What the console shows next to the bar, when present: (metric name, label).
HEADLINE_METRICS = (
    ("critic/score/mean", "reward"),
    ("sft/loss", "loss"),
    ("val/sft_loss", "val loss"),
    ("val/acc", "val acc"),
    ("response_length/mean", "resp len"),
    ("timing_s/step", "s/step"),
    ("async/buffer_units", "buffer"),
    ("async/staleness/mean", "staleness"),
    ("async/trainer_wait_fraction", "trainer waits"),
    ("actor/skipped_total", "skipped updates"),
    ("critic/skipped_total", "critic skipped"),
)
# Shown only when above 0: counts of things that went wrong (updates skipped for a non-finite gradient).
HEADLINE_WHEN_NONZERO = frozenset({"actor/skipped_total", "critic/skipped_total"})


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _finite_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class ConsoleTracker:
    """A progress bar with the headline metrics and ETA on a terminal; one line per step elsewhere (CI, logs)."""

    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False)
        self.total_steps = total_steps
        self.latest: dict[str, float] = {}
        self.live = self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console, disable=not self.live,
        )
        self.task = self.progress.add_task("", total=total_steps)
        if self.live:
            self.progress.start()

    def headline(self) -> str:
        parts = []
        for name, label in HEADLINE_METRICS:
            matches = [v for k, v in self.latest.items() if k == name or (name == "val/acc" and k.startswith("val/") and "/acc/" in k)]
            if matches and (matches[0] or name not in HEADLINE_WHEN_NONZERO):
                parts.append(f"{label} {matches[0]:.3g}")
        return " · ".join(parts)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.latest |= _finite_numbers(metrics)
        self.progress.update(self.task, completed=min(step, self.total_steps), description=self.headline())
        if not self.live:
            self.console.print(f"step {step}/{self.total_steps} · {self.headline()}", highlight=False)

    def close(self) -> None:
        if self.live:
            self.progress.stop()


class JsonlTracker:
    """One JSON object per step: ``{"step": n, "time": unix_s, "metrics": {...}}``; NaN/inf written as null.
    With ``purge_step``, the file's records of that step and later are dropped first."""

    def __init__(self, path: Path, purge_step: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        if purge_step is not None and path.exists():
            truncate_jsonl(path, purge_step)
        self.file = path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in _finite_numbers(metrics).items()}
        self.file.write(json.dumps({"step": step, "time": time.time(), "metrics": clean}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardTracker:
    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the events of that step and later written before it
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in _finite_numbers(metrics).items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Weights & Biases in offline mode: runs land in ``<dir>/wandb`` for a later ``wandb sync``."""

    def __init__(self, project: str, name: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=dict(config), mode="offline", reinit="finish_previous")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(_finite_numbers(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """MLflow with a local file store at ``<dir>/mlruns`` (``mlflow ui --backend-store-uri file:<dir>/mlruns``)."""

    def __init__(self, experiment: str, name: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        import os

        import mlflow

        # MLflow 3 refuses the file store unless asked; a local directory is the point here
        # (no database server on a laptop run).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow = mlflow
        mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(experiment)
        self.run = mlflow.start_run(run_name=name)
        flat = flatten(config)
        mlflow.log_params({k: str(v)[:500] for k, v in list(flat.items())[:100]})

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        safe = {k.replace("@", "_at_"): v for k, v in _finite_numbers(metrics).items() if math.isfinite(v)}
        self.mlflow.log_metrics(safe, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level, keys joined with dots (``{"a": {"b": 1}}`` → ``{"a.b": 1}``)."""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            flat |= flatten(v, f"{prefix}{k}.")
        else:
            flat[f"{prefix}{k}"] = v
    return flat


TRACKERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


def unknown_trackers(names: Sequence[str]) -> str | None:
    """What is wrong with the tracker names of ``trainer.logger``, or None."""
    unknown = [n for n in names if n not in TRACKERS]
    return f"unknown tracker(s) {unknown}; choose from {list(TRACKERS)}" if unknown else None


class Tracking:
    """Fans each step's metrics out to the trackers named in ``trainer.logger``."""

    def __init__(
        self, names: Sequence[str], *, run_dir: Path, project: str, experiment: str, total_steps: int,
        config: Mapping[str, Any] | None = None, purge_step: int | None = None,
    ) -> None:
        problem = unknown_trackers(names)
        if problem:
            raise InputError(f"trainer.logger: {problem}")
        config = dict(config or {})
        builders = {
            "console": lambda: ConsoleTracker(total_steps),
            "jsonl": lambda: JsonlTracker(run_dir / "metrics.jsonl", purge_step),
            "tensorboard": lambda: TensorBoardTracker(run_dir / "tensorboard", purge_step),
            "wandb": lambda: WandbTracker(project, experiment, run_dir, config),
            "mlflow": lambda: MlflowTracker(project, experiment, run_dir, config),
        }
        self.trackers: dict[str, Tracker] = {name: builders[name]() for name in dict.fromkeys(names)}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers.values():
            tracker.log(metrics, step)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The steps a JsonlTracker wrote, in order (what reports and tests read back)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def truncate_jsonl(path: Path, purge_step: int) -> int:
    """Drop the records of ``purge_step`` and later, and a last line cut short by a kill; the new
    file replaces the old one atomically. Returns how many lines went."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            if line.strip() and json.loads(line)["step"] < purge_step:
                kept.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError, TypeError):
            pass  # a record half-written when the run was killed
    if kept == lines:
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.writelines(kept)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return len(lines) - len(kept)


def run_tracking(config: Any, run_dir: Path, total_steps: int, purge_step: int | None = None) -> Tracking:
    """The trackers ``trainer.logger`` names for a run of ``total_steps`` steps, given the whole config;
    ``purge_step``: the first step this run logs, from which what earlier runs recorded is dropped."""
    from omegaconf import OmegaConf

    trainer = config.trainer
    return Tracking(
        trainer.logger, run_dir=run_dir, project=trainer.project_name, experiment=trainer.experiment_name,
        total_steps=total_steps, config=OmegaConf.to_container(OmegaConf.structured(config)), purge_step=purge_step,
    )
