"""The validation curve of one or more runs, read from their metrics files: the accuracy at each
validation step with its 95 % Wilson interval, to compare configurations on the development rows
(``data.dev_size``) before any of them is evaluated on the held-out split.

    python scripts/dev_curve.py lr1e-5=runs/rg/rl lr3e-5=runs/rg_lr3e-5 [--by task] [--first-from lr1e-5]

Each run gives one line per validation: ``step N: acc A [low, high] (n=K), reward R`` (K: the validation's rows,
:func:`samples`); then, after all runs, each one's last − first. A run validated once has none, unless
``--first-from LABEL`` names a run whose first validation stands for the step 0 of those without one (runs from the
same warm-up with ``trainer.val_before_train=false``). With ``--by FIELD`` each validation also gives one line per
value of the rows' ``extra_info[FIELD]`` (``task=chain_sum acc A [low, high] (n=K)``), read from the run's
``validation/step_N.jsonl``, and the last − first per value. The last line is
``dev_curve_best_last_minus_first: X``, the largest last − first over the runs (all rows), or ``none``.
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
            found.append((record["step"], metrics[names[0]], samples(run_dir, record["step"], metrics),
                          metrics.get(f"val/{source}/reward/mean@1")))
    return found


def samples(run_dir: Path, step: int, metrics: dict[str, float]) -> int:
    """The samples a validation's accuracy is over: its episodes in ``validation/step_N.jsonl`` where the run kept
    them; else ``val/reward/samples``, the answers scored, which leaves out an unreadable answer (the accuracy counts
    it, as wrong), so the interval is then a little off on a run whose answers were not all readable."""
    path = run_dir / "validation" / f"step_{step}.jsonl"
    if path.is_file():
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    return int(metrics["val/reward/samples"])


def by_category(run_dir: Path, step: int, field: str) -> dict[str, dict[str, float]]:
    """Accuracy per value of ``extra_info[field]`` in the run's episodes of the validation at ``step``."""
    path = run_dir / "validation" / f"step_{step}.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; --by reads each validation's episodes (trainer.validation_data_dir)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {name: summary for name, summary in summarize_rows(rows, by=field).items() if name != "all"}


def option(arguments: list[str], name: str, needs: str) -> tuple[str | None, list[str]]:
    """``name VALUE`` taken out of ``arguments``: (VALUE or None, the rest)."""
    if name not in arguments:
        return None, arguments
    at = arguments.index(name)
    if at + 1 >= len(arguments):
        raise SystemExit(f"{name} needs {needs}")
    return arguments[at + 1], arguments[:at] + arguments[at + 2:]


def show_run(label: str, path: Path, field: str | None) -> tuple[list, dict[int, dict]]:
    """Print a run's validations (and per ``field``); its points and categories by step."""
    points = curve(path)
    if not points:
        raise SystemExit(f"{path}: no validation in its metrics file (trainer.test_freq, data.dev_size)")
    print(f"{label}: {path}")
    categories = {}
    for step, accuracy, samples, reward in points:
        low, high = wilson(round(accuracy * samples), samples)
        mean_reward = "" if reward is None else f", reward {reward:.3f}"
        print(f"  step {step}: acc {accuracy:.3f} [{low:.3f}, {high:.3f}] (n={samples}){mean_reward}")
        if field is not None:
            categories[step] = by_category(path, step, field)
            for name, summary in sorted(categories[step].items()):
                print(f"    {name} acc {summary['accuracy']:.3f} [{summary['accuracy_low']:.3f}, {summary['accuracy_high']:.3f}] "
                      f"(n={int(summary['episodes'])})")
    return points, categories


def main(arguments: list[str]) -> None:
    field, arguments = option(arguments, "--by", "a field of the rows' extra_info, e.g. --by task")
    base, arguments = option(arguments, "--first-from", "the label of a run whose first validation the others without a step 0 share")
    if not arguments or not all("=" in argument for argument in arguments):
        raise SystemExit(__doc__)
    runs = dict(argument.split("=", 1) for argument in arguments)
    if base is not None and base not in runs:
        raise SystemExit(f"--first-from {base}: no run of that label among {', '.join(runs)}")
    shown = {label: show_run(label, Path(path), field) for label, path in runs.items()}
    gains = []
    for label, (points, categories) in shown.items():
        first, first_categories, whose = points[0], categories.get(points[0][0], {}), ""
        if points[0][0] != 0 and base is not None and label != base:  # no step 0 of its own: the base run's first
            (first, *_), base_categories = shown[base]
            first_categories, whose = base_categories.get(first[0], {}), f" (first: {base}'s step {first[0]})"
        if first is points[-1]:
            print(f"{label}: one validation, no last - first (--first-from LABEL: another run's first validation)")
            continue
        gains.append(points[-1][1] - first[1])
        print(f"{label}: last - first{whose}: {gains[-1]:+.3f}")
        last = categories.get(points[-1][0], {})
        for name in sorted(set(first_categories) & set(last)):
            print(f"    {name}: {last[name]['accuracy'] - first_categories[name]['accuracy']:+.3f}")
    print(f"dev_curve_best_last_minus_first: {max(gains):+.3f}" if gains else "dev_curve_best_last_minus_first: none")


if __name__ == "__main__":
    main(sys.argv[1:])
