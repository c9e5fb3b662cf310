"""The end-of-run report: ``<run_dir>/report/`` with PNG plots over steps and sample generations.

Plots read ``metrics.jsonl`` (the JSONL tracker's file): reward (``critic/score/mean``), validation
accuracy (every ``val/*/acc/*``), response length (``response_length/mean``), KL (``actor/ppo_kl``,
``actor/kl_loss``, ``critic/kl``, whichever were logged), the SFT loss (``sft/loss``, ``val/sft_loss``) and, in
asynchronous runs, staleness, buffer fill and the trainer's waiting share. ``report.md`` ties them together with the
first and last validation's sample generations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posttrain.trainer.tracking import read_jsonl

PANELS = {
    "reward": ("critic/score/mean",),
    "validation_accuracy": ("val/",),
    "response_length": ("response_length/mean",),
    "kl": ("actor/ppo_kl", "actor/kl_loss", "critic/kl"),
    "sft_loss": ("sft/loss", "val/sft_loss"),
    "async": ("async/staleness/mean", "async/buffer_units", "async/trainer_wait_fraction"),
}


@dataclass(frozen=True)
class Sample:
    prompt: str
    response: str
    score: float


def series(records: Sequence[dict], prefixes: Sequence[str]) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (steps, values) for every logged metric matching a panel (val: only accuracies)."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for name, value in record["metrics"].items():
            wanted = any(name == p or (p.endswith("/") and name.startswith(p) and "/acc/" in name) for p in prefixes)
            if wanted and value is not None:
                steps, values = found.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(value)
    return found


def plot_panels(records: Sequence[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for panel, prefixes in PANELS.items():
        lines = series(records, prefixes)
        if not lines:
            continue
        figure, axis = plt.subplots(figsize=(6, 3.5))
        for name, (steps, values) in sorted(lines.items()):
            axis.plot(steps, values, marker="o", markersize=3, label=name)
        axis.set_xlabel("step")
        axis.set_title(panel.replace("_", " "))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = out_dir / f"{panel}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def write_report(run_dir: Path, first_samples: Sequence[Sample] = (), last_samples: Sequence[Sample] = ()) -> Path:
    """Write ``<run_dir>/report/report.md`` and its plots; returns the report's path."""
    out_dir = run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    plots = plot_panels(read_jsonl(metrics_file), out_dir) if metrics_file.exists() else []
    lines = [f"# Run report: {run_dir.name}", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots] or ["(no metrics.jsonl: enable the jsonl logger for plots)"]
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
