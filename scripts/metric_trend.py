"""Whether a run's metrics moved: each named metric's mean over the first and the last ``--window``
training steps of a run's metrics file, and over all of them.

    python scripts/metric_trend.py runs/rg/rl critic/score/mean dynamic_sampling/rounds [--window 10]

One line per metric: ``NAME: first W A, last W B, all N C``; steps without the metric (a validation's
own record) are left out. ``--each`` adds a line per metric with its value at every step, in order (two
runs' lines side by side show whether they went alike). The last line is
``metric_trend_last_minus_first: X`` for the first metric named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean


def values(run_dir: Path, name: str) -> list[float]:
    """The metric at each step that has it, in step order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (a run directory holds metrics.jsonl)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [float(r["metrics"][name]) for r in sorted(records, key=lambda r: r["step"]) if name in r["metrics"]]


def main(arguments: list[str]) -> None:
    window, each = 10, "--each" in arguments
    arguments = [a for a in arguments if a != "--each"]
    if "--window" in arguments:
        at = arguments.index("--window")
        window, arguments = int(arguments[at + 1]), arguments[:at] + arguments[at + 2:]
    if len(arguments) < 2 or window < 1:
        raise SystemExit(__doc__)
    run_dir, names = Path(arguments[0]), arguments[1:]
    changes = []
    for name in names:
        found = values(run_dir, name)
        if not found:
            raise SystemExit(f"{run_dir}: no step has {name!r}")
        first, last = mean(found[:window]), mean(found[-window:])
        changes.append(last - first)
        print(f"{name}: first {min(window, len(found))} {first:.3f}, last {min(window, len(found))} {last:.3f}, all {len(found)} {mean(found):.3f}")
        if each:
            print(f"{name} by step: {' '.join(f'{value:.3f}' for value in found)}")
    print(f"metric_trend_last_minus_first: {changes[0]:+.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
