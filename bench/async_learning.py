"""Asynchronous vs synchronous training on the same task: validation accuracy against trained samples
and against wall time, from two finished runs' ``metrics.jsonl``.

    posttrain train trainer.default_local_dir=runs/cmp/sync
    posttrain train trainer.default_local_dir=runs/cmp/async trainer.mode=async async.max_staleness=2
    .venv/bin/python -m bench.async_learning runs/cmp/sync runs/cmp/async

Writes ``report/async_vs_sync.png`` into the async run's report and a section in its ``report.md``;
prints both curves. Wall time counts from each run's first logged record (the validation before
training) to each validation. The last line is ``async_over_sync_wall_time: <ratio>``: the async
run's wall time to its last validation over the sync run's (same number of trained samples).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def curve(run_dir: Path, metric: str) -> list[tuple[int, float, float]]:
    """(trained samples, seconds since the first record, accuracy) at every validation."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    per_step = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    start = records[0]["time"]
    return [(r["step"] * per_step, r["time"] - start, r["metrics"][metric]) for r in records if metric in r["metrics"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sync_run", type=Path)
    parser.add_argument("async_run", type=Path)
    parser.add_argument("--metric", default=None, help="default: the first val/*/acc/mean@* metric")
    args = parser.parse_args()
    first = json.loads((args.sync_run / "metrics.jsonl").read_text().splitlines()[0])["metrics"]
    metric = args.metric or next(name for name in first if name.startswith("val/") and "/acc/mean@" in name)
    curves = {"sync": curve(args.sync_run, metric), "async": curve(args.async_run, metric)}
    for name, points in curves.items():
        print(f"{name}: " + "  ".join(f"{samples} samples {seconds / 60:.1f} min acc {acc:.3f}" for samples, seconds, acc in points))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_samples, by_time) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, points in curves.items():
        by_samples.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=name)
        by_time.plot([p[1] / 60 for p in points], [p[2] for p in points], marker="o", label=name)
    by_samples.set_xlabel("trained samples")
    by_time.set_xlabel("wall time (min)")
    for axis in (by_samples, by_time):
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    report = args.async_run / "report"
    report.mkdir(parents=True, exist_ok=True)
    figure.savefig(report / "async_vs_sync.png", dpi=100)
    ratio = curves["async"][-1][1] / curves["sync"][-1][1]
    section = (
        f"\n## Asynchronous vs synchronous\n\n![async vs sync](async_vs_sync.png)\n\n"
        f"{metric}: sync {curves['sync'][0][2]:.3f} → {curves['sync'][-1][2]:.3f} in {curves['sync'][-1][1] / 60:.1f} min, "
        f"async {curves['async'][0][2]:.3f} → {curves['async'][-1][2]:.3f} in {curves['async'][-1][1] / 60:.1f} min "
        f"({curves['async'][-1][0]} trained samples each; sync run: {args.sync_run}).\n"
    )
    markdown = report / "report.md"
    before = markdown.read_text().split(section.splitlines()[1])[0].rstrip("\n") + "\n" if markdown.exists() else ""
    markdown.write_text(before + section)  # a second run replaces the section
    print(f"plot: {report / 'async_vs_sync.png'}")
    print(f"async_over_sync_wall_time: {ratio:.2f}")


if __name__ == "__main__":
    main()
