"""Which held-out rows two BFCL evaluations answer differently: per category, the rows the second fixed (wrong in
the first, right in the second) and the rows it broke (right, then wrong), and the kinds of mistake the changed rows
moved between, each row judged by BFCL's own checker (posttrain/rewards/bfcl_mistakes.py).

    .venv/bin/python scripts/bfcl_churn.py RUN/sft_eval/episodes.jsonl RUN/rl_eval/episodes.jsonl

A paired difference says how far the second evaluation is from the first on the whole; this says what it took:
an rl stage that gains 2 rows may have fixed 35 and broken 33. The rows are paired by item (as the recipe's table
pairs them), one answer an item (a greedy evaluation's); a row in one file only is left out and counted. The last
line is ``bfcl_churn_net: N``, the rows fixed less the rows broken.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from posttrain.errors import InputError, PosttrainError
from posttrain.rewards.bfcl_mistakes import RIGHT, episode_rows, judge
from posttrain.trainer.validation import item_key


def churn(first: Path, second: Path) -> str:
    """Markdown: fixed, broken and net rows per category (then all), the changed rows' kinds (first → second,
    most rows first), and the closing ``bfcl_churn_net`` line."""
    from posttrain.models.tool_formats import CallParser

    parser = CallParser("hermes", None, [])
    before, after = (one_row_per_item(path) for path in (first, second))
    shared = [key for key in before if key in after]
    counts: dict[str, Counter] = {}
    moves: Counter = Counter()
    for key in shared:
        was, now = judge(before[key], parser)[0], judge(after[key], parser)[0]
        category = before[key]["extra_info"]["category"]
        for group in (category, "all"):
            counts.setdefault(group, Counter()).update(fixed=int(was != RIGHT and now == RIGHT), broken=int(was == RIGHT and now != RIGHT))
        if was != now:
            moves[(was, now)] += 1
    order = sorted(set(counts) - {"all"}) + ["all"] if counts else []
    lines = ["| category | fixed | broken | net |", "|---|---|---|---|"]
    lines += [f"| {group} | {counts[group]['fixed']} | {counts[group]['broken']} | {counts[group]['fixed'] - counts[group]['broken']:+d} |"
              for group in order]
    lines += ["", "| first → second | rows |", "|---|---|"]
    lines += [f"| {was} → {now} | {rows} |" for (was, now), rows in sorted(moves.items(), key=lambda item: (-item[1], item[0]))]
    alone = len(before) + len(after) - 2 * len(shared)
    if alone:
        lines += ["", f"rows in one file only, left out: {alone}"]
    total = counts.get("all", Counter())
    return "\n".join(lines + ["", f"bfcl_churn_net: {total['fixed'] - total['broken']:+d}"])


def one_row_per_item(path: Path) -> dict[str, dict]:
    """The file's rows by item; an InputError where an item has several (an evaluation that sampled each row more
    than once: a row is right or wrong only in a greedy one)."""
    rows: dict[str, dict] = {}
    for row in episode_rows(path):
        if (key := item_key(row)) in rows:
            raise InputError(f"{path}: item {row['extra_info'].get('id', key)!r} appears more than once: give greedy "
                             "evaluations, one answer a row (actor_rollout_ref.rollout.val_kwargs.n=1)")
        rows[key] = row
    return rows


def main(arguments: list[str]) -> None:
    if len(arguments) != 2:
        raise SystemExit(__doc__)
    try:
        print(churn(Path(arguments[0]), Path(arguments[1])))
    except (PosttrainError, OSError) as error:
        raise SystemExit(f"bfcl_churn: {error}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
