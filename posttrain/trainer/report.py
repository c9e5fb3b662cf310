"""The end-of-run report: ``<run_dir>/report/`` with PNG plots over steps and sample generations.

Plots read ``metrics.jsonl`` (the JSONL tracker's file): reward (``critic/score/mean``), validation
accuracy (every ``val/*/acc/*``), response length (``response_length/mean``), KL (``actor/ppo_kl``,
``actor/kl_loss``, ``critic/kl``, whichever were logged), a rubric's parts (``reward/<part>``, with their failures
in ``report.md``), the SFT loss (``sft/loss``, ``val/sft_loss``), each
worker process's memory (every ``memory/*/rss_gb``, its high-water mark ``peak_rss_gb``, and glibc's heap in use and kept free, ``heap_used_gb`` / ``heap_free_gb``: a line that climbs step after step is a leak)
and, in asynchronous runs, staleness, buffer fill and the trainer's waiting share. ``report.md`` ties them together with each
validation accuracy's first and last value and the first and last validation's sample generations.

"First" is the run's, across resumes: the values come from ``metrics.jsonl`` (which a resumed run
continues), the samples from ``report/first_samples.json``, kept by the trainer from the run's first
validation (:func:`save_samples`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.trainer import provenance
from posttrain.trainer.intervals import with_interval
from posttrain.trainer.tracking import read_jsonl

PANELS = {
    "reward": ("critic/score/mean",),
    "validation_accuracy": ("val/",),
    "response_length": ("response_length/mean",),
    "kl": ("actor/ppo_kl", "actor/kl_loss", "critic/kl"),
    "sft_loss": ("sft/loss", "val/sft_loss"),
    "async": ("async/staleness/mean", "async/buffer_units", "async/trainer_wait_fraction"),
    "memory": ("memory/",),
    "rubric": ("reward/",),
}
FIRST_SAMPLES = "first_samples.json"  # in <run_dir>/report/: the run's first validation's samples


@dataclass(frozen=True)
class Sample:
    prompt: str
    response: str
    score: float


def series(records: Sequence[dict], prefixes: Sequence[str]) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (steps, values) for every logged metric matching a panel: a name, or a prefix ending in
    "/" (every name under it; under ``val/`` only accuracies; under ``reward/`` only a rubric's parts' means)."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for name, value in record["metrics"].items():
            wanted = any(name == p or (p.endswith("/") and name.startswith(p) and _in_panel(p, name, record["metrics"])) for p in prefixes)
            if wanted and value is not None:
                steps, values = found.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(value)
    return found


def _in_panel(prefix: str, name: str, metrics: dict) -> bool:
    if prefix == "val/":
        return "/acc/" in name
    if prefix == "reward/":  # a rubric's part: reward/<part>, logged beside its reward/<part>/errors (rewards/manager.py)
        return "/" not in name.removeprefix(prefix) and f"{name}/errors" in metrics
    return True


def first_and_last_validation(records: Sequence[dict]) -> dict[str, tuple[tuple[int, str], tuple[int, str]]]:
    """name -> ((step, value) at the first validation, (step, value) at the last), for every accuracy;
    each value as text with its 95 % interval where the record holds one (``0.700 [0.521, 0.833]``)."""
    by_step = {record["step"]: record["metrics"] for record in records}
    return {name: ((steps[0], with_interval(by_step[steps[0]], name)), (steps[-1], with_interval(by_step[steps[-1]], name)))
            for name, (steps, _) in series(records, ("val/",)).items()}


def save_samples(path: Path, samples: Sequence[Sample]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(s) for s in samples], ensure_ascii=False), encoding="utf-8")


def load_samples(path: Path) -> list[Sample]:
    return [Sample(**s) for s in json.loads(path.read_text(encoding="utf-8"))] if path.is_file() else []


def plot_panels(records: Sequence[dict], out_dir: Path) -> list[Path]:
    # a Figure of its own, not pyplot's: no global backend or figure registry touched in the caller's
    # process, and pyplot's import is left out of every run's end
    from matplotlib.figure import Figure

    written = []
    for panel, prefixes in PANELS.items():
        lines = series(records, prefixes)
        if not lines:
            continue
        figure = Figure(figsize=(6, 3.5))
        axis = figure.subplots()
        for name, (steps, values) in sorted(lines.items()):
            axis.plot(steps, values, marker="o", markersize=3, label=name)
        axis.set_xlabel("step")
        axis.set_title(panel.replace("_", " "))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = out_dir / f"{panel}.png"
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


def write_report(run_dir: Path, first_samples: Sequence[Sample] = (), last_samples: Sequence[Sample] = ()) -> Path:
    """Write ``<run_dir>/report/report.md`` and its plots; returns the report's path."""
    out_dir = run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    records = read_jsonl(metrics_file) if metrics_file.exists() else []
    plots = plot_panels(records, out_dir)
    lines = [f"# Run report: {run_dir.name}", ""]
    made = provenance.find(run_dir)
    if made is not None:
        lines += [f"Made by: {provenance.summary(made)} (`{provenance.PROVENANCE}`)", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots] or ["(no metrics.jsonl: enable the jsonl logger for plots)"]
    endpoints = first_and_last_validation(records)
    if endpoints:
        lines += ["", "## Validation: first → last", ""]
        lines += [f"- `{name}`: {first} (step {a}) → {last} (step {b})"
                  for name, ((a, first), (b, last)) in sorted(endpoints.items())]
    parts = series(records, ("reward/",))
    if parts:
        totals = {f"{name}/{kind}": sum(record["metrics"].get(f"{name}/{kind}") or 0 for record in records)
                  for name in parts for kind in ("errors", "unparsable")}
        lines += ["", "## Rubric parts: first step → last (training answers' mean)", ""]
        lines += [f"- `{name}`: {values[0]:.3f} (step {steps[0]}) → {values[-1]:.3f} (step {steps[-1]}); "
                  f"{totals[f'{name}/errors']:g} failed, {totals[f'{name}/unparsable']:g} unread (judge) over the run"
                  for name, (steps, values) in sorted(parts.items())]
    for title, samples in (("First validation", first_samples), ("Last validation", last_samples)):
        if samples:
            lines += ["", f"## {title}: sample generations", ""]
            for s in samples:
                lines += [f"**score {s.score:g}** — prompt:", "", _quote(s.prompt), "", "response:", "", _quote(s.response), ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" for line in text.strip().splitlines()) or "> (empty)"
