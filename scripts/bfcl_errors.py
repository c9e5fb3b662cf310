"""What kind of mistakes a policy makes on BFCL, per category, side by side for several evaluations.

    .venv/bin/python scripts/bfcl_errors.py base=RUN/base_eval/validation/step_0.jsonl \
        SFT=RUN/sft_eval/validation/step_0.jsonl RL=RUN/rl_eval/validation/step_0.jsonl

Each file is an evaluation's episodes (``posttrain eval`` writes them under the run's
``validation/``; ``--dump-episodes`` too). Each answer's calls are read again from its text (the
hermes format, by posttrain's parser) and judged by BFCL's own checker
(:func:`posttrain.rewards.bfcl.check_calls`); its error type is put in one of a few kinds: wrong
function, wrong number of calls, missing parameter, unexpected parameter, wrong value or type, no
call where one was due, a call on an irrelevance row, an unreadable call. Prints one table per category
(counts of each kind per evaluation) and the whole, each with its call rate: on the rows that need a
call, the share where the answer made at least one readable call (so that irrelevance's accuracy, which
never calling wins, is read beside how often the policy still calls where it must).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from posttrain.rewards import bfcl
from posttrain.models.tool_formats import CallParser

KINDS = {
    "wrong_func_name": "wrong function", "wrong_count": "wrong number of calls", "missing_required": "missing parameter",
    "missing_optional": "missing optional param",  # left out, but the possible answer has no "" (omit) for it
    "unexpected_param": "unexpected parameter", "decoder_success": "call on irrelevance row",
    "decoder_failed": "no call", "decoder_wrong_output_format": "unreadable call",
}


def kind(verdict: bfcl.Verdict) -> str:
    """One of a few readable kinds for BFCL's error type (the parallel checker's hidden one where it hides it)."""
    if verdict.valid:
        return "right"
    error = verdict.sub_error_types[0] if verdict.error_type.endswith("cannot_find_match") and verdict.sub_error_types else verdict.error_type
    prefix, _, name = error.partition(":")
    if prefix in ("value_error", "type_error") or name.startswith(("value_error", "type_error")):
        return "wrong value or type"
    return KINDS.get(name, error)


def judge(row: dict, parser: CallParser) -> tuple[str, bool]:
    """The answer's kind of mistake (or "right"), and whether it made at least one readable call."""
    text = row["messages"][-1]["content"] if row["messages"] and row["messages"][-1]["role"] == "assistant" else ""
    turn = parser(text)
    if turn.malformed:
        return "unreadable call", bool(turn.calls)
    calls = [{"name": call.name, "arguments": json.loads(call.arguments or "{}")} for call in turn.calls]
    if not calls and not bfcl.is_no_call_category(row["extra_info"]["category"]):
        return "no call", False
    return kind(bfcl.check_calls(calls, row["ground_truth"], row["extra_info"])), bool(calls)


def main(arguments: list[str]) -> None:
    if not arguments or any("=" not in a for a in arguments):
        raise SystemExit(__doc__)
    parser = CallParser("hermes", None, [])
    counts: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))  # category -> label -> kinds
    calls: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))  # category -> label -> due, made
    labels = []
    for argument in arguments:
        label, path = argument.split("=", 1)
        labels.append(label)
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            found, called = judge(row, parser)
            due = not bfcl.is_no_call_category(row["extra_info"]["category"])
            for category in (row["extra_info"]["category"], "all"):
                counts[category][label][found] += 1
                calls[category][label]["due"] += due
                calls[category][label]["made"] += due and called
    for category, by_label in counts.items():
        kinds = sorted({k for c in by_label.values() for k in c}, key=lambda k: (k != "right", k))
        print(f"\n{category} ({sum(by_label[labels[0]].values())} rows)")
        print(f"  {'kind':28}" + "".join(f"{label:>8}" for label in labels))
        for name in kinds:
            print(f"  {name:28}" + "".join(f"{by_label[label][name]:>8}" for label in labels))
        if calls[category][labels[0]]["due"]:
            rates = [calls[category][label]["made"] / calls[category][label]["due"] for label in labels]
            print(f"  {'call rate where one is due':28}" + "".join(f"{rate:>8.3f}" for rate in rates))


if __name__ == "__main__":
    main(sys.argv[1:])
