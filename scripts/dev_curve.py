"""The validation curve of one or more runs, read from their metrics files: the accuracy at each
validation step with its 95 % Wilson interval, to compare configurations on the development rows
(``data.dev_size``) before any of them is evaluated on the held-out split.

    python scripts/dev_curve.py lr1e-5=runs/rg/rl lr3e-5=runs/rg_lr3e-5

Each run gives one line per validation: ``step N: acc A [low, high] (n=K), reward R``; then its first and
last. The last line is ``dev_curve_best_last_minus_first: X``, the largest last − first over the runs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from posttrain.trainer.intervals import wilson

ACCURACY = re.compile(r"^val/(?!reward/)([^/]+)/acc/mean@1$")


def curve(run_dir: Path) -> list[tuple[int, float, int, float | None]]:
    """(step, accuracy, validation samples, mean reward) for each validation in ``run_dir/metrics.jsonl``."""
    found = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        metrics = record["metrics"]
        names = [name for name in metrics if ACCURACY.match(name)]
        if len(names) > 1:
            raise SystemExit(f"{run_dir}: several data sources are validated ({names}); this script reads one")
        if names:
            source = ACCURACY.match(names[0]).group(1)
            found.append((record["step"], metrics[names[0]], int(metrics["val/reward/samples"]), metrics.get(f"val/{source}/reward/mean@1")))
    return found


def main(arguments: list[str]) -> None:
    if not arguments or not all("=" in argument for argument in arguments):
        raise SystemExit(__doc__)
    gains = []
    for label, path in (argument.split("=", 1) for argument in arguments):
        points = curve(Path(path))
        if not points:
            raise SystemExit(f"{path}: no validation in its metrics file (trainer.test_freq, data.dev_size)")
        print(f"{label}: {path}")
        for step, accuracy, samples, reward in points:
            low, high = wilson(round(accuracy * samples), samples)
            print(f"  step {step}: acc {accuracy:.3f} [{low:.3f}, {high:.3f}] (n={samples})" + ("" if reward is None else f", reward {reward:.3f}"))
        gains.append(points[-1][1] - points[0][1])
        print(f"  last - first: {gains[-1]:+.3f}")
    print(f"dev_curve_best_last_minus_first: {max(gains):+.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
