"""The validation curve of one or more runs, read from their metrics files: the accuracy at each
validation step with its 95 % Wilson interval, to compare configurations on the development rows
(``data.dev_size``) before any of them is evaluated on the held-out split.

    python scripts/dev_curve.py lr1e-5=runs/rg/rl lr3e-5=runs/rg_lr3e-5 [--by task]

Each run gives one line per validation: ``step N: acc A [low, high] (n=K), reward R``; then its first and
last. With ``--by FIELD`` each validation also gives one line per value of the rows' ``extra_info[FIELD]``
(``task=chain_sum acc A [low, high] (n=K)``), read from the run's ``validation/step_N.jsonl``, and the
first and last per value. The last line is ``dev_curve_best_last_minus_first: X``, the largest last −
first over the runs (all rows).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from posttrain.trainer.intervals import wilson
from posttrain.trainer.validation import summarize_rows

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


def by_category(run_dir: Path, step: int, field: str) -> dict[str, dict[str, float]]:
    """Accuracy per value of ``extra_info[field]`` in the run's episodes of the validation at ``step``."""
    path = run_dir / "validation" / f"step_{step}.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; --by reads each validation's episodes (trainer.validation_data_dir)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {name: summary for name, summary in summarize_rows(rows, by=field).items() if name != "all"}


def main(arguments: list[str]) -> None:
    field = None
    if "--by" in arguments:
        at = arguments.index("--by")
        if at + 1 >= len(arguments):
            raise SystemExit("--by needs a field of the rows' extra_info, e.g. --by task")
        field, arguments = arguments[at + 1], arguments[:at] + arguments[at + 2:]
    if not arguments or not all("=" in argument for argument in arguments):
        raise SystemExit(__doc__)
    gains = []
    for label, path in (argument.split("=", 1) for argument in arguments):
        points = curve(Path(path))
        if not points:
            raise SystemExit(f"{path}: no validation in its metrics file (trainer.test_freq, data.dev_size)")
        print(f"{label}: {path}")
        categories = {}
        for step, accuracy, samples, reward in points:
            low, high = wilson(round(accuracy * samples), samples)
            print(f"  step {step}: acc {accuracy:.3f} [{low:.3f}, {high:.3f}] (n={samples})" + ("" if reward is None else f", reward {reward:.3f}"))
            if field is not None:
                categories[step] = by_category(Path(path), step, field)
                for name, summary in sorted(categories[step].items()):
                    print(f"    {name} acc {summary['accuracy']:.3f} [{summary['accuracy_low']:.3f}, {summary['accuracy_high']:.3f}] "
                          f"(n={int(summary['episodes'])})")
        gains.append(points[-1][1] - points[0][1])
        print(f"  last - first: {gains[-1]:+.3f}")
        if categories:
            first, last = categories[points[0][0]], categories[points[-1][0]]
            for name in sorted(set(first) & set(last)):
                print(f"    {name}: {last[name]['accuracy'] - first[name]['accuracy']:+.3f}")
    print(f"dev_curve_best_last_minus_first: {max(gains):+.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
