"""How often BFCL evaluations answer a one-call question with several calls, apart for the questions that join two
arguments' values with "and" (``prepare bfcl joined_values``'s shape: "a base of 10 units and height of 5 units",
found by :func:`posttrain.data.preparers.bfcl_added.joins_values`) and the other one-call questions.

    .venv/bin/python scripts/bfcl_joined.py SFT=RUN/sft_eval/episodes.jsonl RL=RUN/rl_eval/episodes.jsonl

``multi_value``'s training rows list one argument's values joined by "and", answered by one call per value; a policy
that learns the shape without reading the functions calls again where two arguments' values are joined so. Each file is
an evaluation's episodes; its rows whose possible answer is one call are counted (each row's calls read as
scripts/bfcl_errors.py reads them, right as BFCL's checker judges). Prints a Markdown table (evaluation × shape: rows,
the share answered right, the share answered with two or more readable calls); the last line is
``bfcl_joined_several_calls: X``, the last evaluation's share with several calls on the joined rows.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from posttrain.data.preparers.bfcl import Question
from posttrain.data.preparers.bfcl_added import joins_values
from posttrain.errors import InputError
from posttrain.rewards.bfcl_mistakes import RIGHT, episode_rows, judge
from posttrain.rewards.episodes_file import read_labelled

SHAPES = ("joined", "other")


def tally(path: Path) -> dict[str, Counter]:
    """shape → counts of the file's one-call rows: ``rows``, ``right``, ``several`` (two or more readable calls)."""
    from posttrain.models.tool_formats import CallParser

    parser = CallParser("hermes", None, [])
    counts = {shape: Counter() for shape in SHAPES}
    for number, row in enumerate(episode_rows(path), 1):
        try:
            truth = json.loads(row["ground_truth"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: BFCL row {number} has no ground_truth as JSON text (BFCL's possible answer): "
                             "give an evaluation's episodes file") from None
        if len(truth) != 1:
            continue
        prompt = [m for m in row["messages"] if m["role"] != "assistant"]
        question = Question(row["extra_info"].get("id", ""), row["extra_info"]["category"], prompt, [], truth)
        found, calls = judge(row, parser)
        counts["joined" if joins_values(question) else "other"].update(rows=1, right=found == RIGHT, several=len(calls) > 1)
    return counts


def main(arguments: list[str]) -> None:
    tallies = read_labelled(arguments, "bfcl_joined", __doc__, lambda path: tally(Path(path)))
    print("| evaluation | shape | one-call rows | right | several calls |\n|---|---|---|---|---|")
    for label, counts in tallies.items():
        for shape in SHAPES:
            n = counts[shape]["rows"]
            shares = (f"{counts[shape][k] / n:.3f}" if n else "—" for k in ("right", "several"))
            print(f"| {label} | {shape} | {n} | " + " | ".join(shares) + " |")
    last = tallies[list(tallies)[-1]]["joined"]
    print(f"\nbfcl_joined_several_calls: {last['several'] / last['rows']:.3f}" if last["rows"] else "\nbfcl_joined_several_calls: none")


if __name__ == "__main__":
    main(sys.argv[1:])
