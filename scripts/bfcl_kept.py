"""What an rl stage's updates saw on BFCL rows: the samples of the groups dynamic sampling kept (the step files
``trainer.rollout_data_dir`` writes, one per step), by how many calls each row's possible answer holds.

    .venv/bin/python scripts/bfcl_kept.py RL=RUN/rl/rollouts EARLY=RUN/rl/rollouts@1-12 LATE=RUN/rl/rollouts@13-24

Each argument is LABEL=DIR (every ``step_N.jsonl`` in it) or LABEL=DIR@FIRST-LAST (those steps only). A row's wanted
calls are its ground truth's (0: a row whose right answer is no call); its sample's calls are the readable ones
(read as scripts/bfcl_errors.py reads them: an unreadable answer has none). Groups whose samples all scored alike were
dropped before the update and are not in these files (``dynamic_sampling/dropped_groups`` counts them); a guided row
(``algorithm.guidance``: the reference answer, not sampled) is left out. Prints a Markdown table (label × wanted calls:
kept groups, samples, the share with fewer calls than wanted and their mean reward, the share with more and their mean
reward and mean advantage); the last line is ``bfcl_kept_extra_calls: X``, the last label's share of samples with more
calls than wanted on rows that want one.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from posttrain.errors import InputError
from posttrain.rewards.bfcl_mistakes import episode_rows
from posttrain.rewards.episodes_file import read_labelled

WANTED = ("0", "1", "2", "3", "4 or more")


def _steps(spec: str) -> list[Path]:
    """The step files ``DIR`` or ``DIR@FIRST-LAST`` names, in step order; an InputError if there are none."""
    folder, _, span = spec.rpartition("@") if "@" in spec else (spec, "", "")
    files = {int(m.group(1)): p for p in Path(folder).glob("step_*.jsonl") if (m := re.fullmatch(r"step_(\d+)\.jsonl", p.name))}
    if span:
        if not re.fullmatch(r"\d+-\d+", span):
            raise InputError(f"{spec}: the steps are FIRST-LAST, e.g. {folder}@1-12")
        first, last = map(int, span.split("-"))
        if first > last:
            raise InputError(f"{spec}: the first step is after the last")
        files = {step: path for step, path in files.items() if first <= step <= last}
    if not files:
        raise InputError(f"{spec}: no step_N.jsonl files (a run's trainer.rollout_data_dir, e.g. RUN/rl/rollouts)")
    return [files[step] for step in sorted(files)]


def tally(spec: str) -> dict[str, dict[str, list]]:
    """wanted → ``groups`` (the uids), ``fewer``, ``more`` (one flag per sample), ``advantages`` (of the samples with more),
    ``fewer_rewards`` and ``more_rewards``; an InputError if the steps hold no BFCL row."""
    from posttrain.models.tool_formats import CallParser

    parser = CallParser("hermes", None, [])
    counts: dict[str, dict[str, list]] = defaultdict(lambda: {key: [] for key in ("groups", "fewer", "more", "advantages",
                                                                                  "fewer_rewards", "more_rewards")})
    for path in _steps(spec):
        for number, row in enumerate(episode_rows(path), 1):
            try:
                wanted, uid, advantage = len(json.loads(row["ground_truth"])), row["uid"], float(row["advantage"])
                reward = float(row["reward"])
            except (KeyError, TypeError, ValueError):
                raise InputError(f"{path}: BFCL row {number} has no ground_truth as JSON text, uid, advantage or reward: give "
                                 "the step files trainer.rollout_data_dir writes") from None
            if row.get("guided"):
                continue
            messages = row["messages"]
            text = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
            made = len(parser(text).calls)
            entry = counts[WANTED[min(wanted, len(WANTED) - 1)]]
            entry["groups"].append(uid)
            entry["fewer"].append(made < wanted)
            entry["more"].append(made > wanted)
            if made > wanted:
                entry["advantages"].append(advantage)
                entry["more_rewards"].append(reward)
            elif made < wanted:
                entry["fewer_rewards"].append(reward)
    if not counts:
        raise InputError(f"{spec}: no sampled BFCL row in its step files")
    return counts


def main(arguments: list[str]) -> None:
    tallies = read_labelled(arguments, "bfcl_kept", __doc__, tally)
    print("| label | wanted calls | kept groups | samples | fewer calls | reward with fewer | more calls | reward with more "
          "| advantage with more |\n|---|---|---|---|---|---|---|---|---|")
    for label, counts in tallies.items():
        for wanted in (w for w in WANTED if w in counts):
            entry, n = counts[wanted], len(counts[wanted]["more"])
            means = (f"{sum(values) / len(values):{sign}.3f}" if values else "—"
                     for values, sign in ((entry["fewer_rewards"], ""), (entry["more_rewards"], ""), (entry["advantages"], "+")))
            fewer, more, advantage = means
            print(f"| {label} | {wanted} | {len(set(entry['groups']))} | {n} | {sum(entry['fewer']) / n:.3f} | {fewer} | "
                  f"{sum(entry['more']) / n:.3f} | {more} | {advantage} |")
    one = tallies[list(tallies)[-1]].get("1")
    print(f"\nbfcl_kept_extra_calls: {sum(one['more']) / len(one['more']):.3f}" if one else "\nbfcl_kept_extra_calls: none")


if __name__ == "__main__":
    main(sys.argv[1:])
