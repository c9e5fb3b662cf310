"""``posttrain compare A.jsonl B.jsonl``: two evaluations of the same items set side by side, each
accuracy with its 95 % Wilson interval and B − A with a paired bootstrap interval, and on how many items
the two wrote the same transcript (each file's first episode of the item). The episode files
are what ``posttrain eval --dump-episodes`` and a run's ``validation/step_N.jsonl`` hold; reading
them is ``trainer/validation.py``'s."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from posttrain.errors import InputError
from posttrain.trainer import provenance
from posttrain.trainer.intervals import paired_difference, wilson
from posttrain.trainer.validation import item_accuracies, item_groups


def compare_evaluations(first: Path, second: Path, by: str | None = None) -> int:
    """``posttrain compare A.jsonl B.jsonl``: each evaluation's accuracy on the items both hold, with
    its 95 % Wilson interval, and B − A with a paired bootstrap interval (per ``extra_info[by]`` too)."""
    console = Console(highlight=False)
    (a, rows), (b, rows_b) = item_accuracies(first), item_accuracies(second)  # what they refuse goes up to main, as one line
    made = provenance.find(first), provenance.find(second)
    if None not in made and (differ := provenance.differences(*made)):
        console.print("posttrain: warning: A and B were made differently (their runs' provenance.json):\n  " + "\n  ".join(differ))
    common = [key for key in a if key in b]
    if not common:
        raise InputError(f"{first} and {second} hold no item in common (the same prompt, data source and ground truth): "
                         "compare two evaluations of the same held-out set")
    if len(common) < max(len(a), len(b)):
        console.print(f"posttrain: comparing the {len(common)} items both files hold ({len(a)} in {first}, {len(b)} in {second})")
    for group, keys in item_groups(common, rows, by).items():
        lines = [f"{group} ({len(keys)} items)"]
        for label, accuracies in (("A", a), ("B", b)):
            values = [accuracies[key] for key in keys]
            low, high = wilson(sum(values), len(values))
            lines.append(f"  {label} accuracy {sum(values) / len(values):.3f} [{low:.3f}, {high:.3f}]")
        difference, low, high = paired_difference([a[key] for key in keys], [b[key] for key in keys])
        lines.append(f"  B - A {difference:+.3f}, paired 95% interval [{low:+.3f}, {high:+.3f}]")
        same = sum(rows[key].get("messages") == rows_b[key].get("messages") for key in keys)
        lines.append(f"  the same transcript in A and B: {same} of {len(keys)} items")
        console.print("\n".join(lines))
    return 0
