"""What kind of mistake each BFCL answer is, per category, for several evaluations side by side.

Each evaluation is an episodes file (``posttrain eval`` writes ``episodes.jsonl`` in a recipe's eval
stage and ``validation/step_N.jsonl`` in a run). Each answer's calls are read again from its text (the
hermes format, by posttrain's parser: the format the BFCL presets' ``auto`` picks for SmolLM2; a
model told another format would need its parser here) and judged by BFCL's own checker
(:func:`bfcl.check_calls`); its error type is put in one of a few kinds: wrong function, wrong number of calls, missing
parameter, unexpected parameter, wrong value or type, no call where one was due, a call on an
irrelevance row, an unreadable call.

Beside the kinds stands the **call rate**: on the rows that need a call, the share where the answer
made at least one readable call. Irrelevance's accuracy can be won by never calling; the call rate
shows how often the policy still calls where it must. Beside it, the **calls right**: of those rows with a
readable call, the share BFCL's checker accepts; a policy that only calls more or less often moves the call
rate, one that learns which call to make moves this. The **arguments per call**: on those rows, the mean
number of arguments a readable call wrote (arguments that are not an object count as none); a policy that learns to
leave parameters out (one left out is no worse than one given wrong under BFCL's verdict, and it may be one the answer can
omit) moves this. The **calls per answer**: on the rows that need a call and got a readable one, the mean number of
readable calls; where two or more are due (the parallel categories), a policy that learns to stop after its first call
moves this. The **right number of calls by calls wanted**: on the rows that need a call and got a readable one, apart by
how many calls the possible answer has (1, 2, 3, 4 or more), the share whose answer made exactly that many readable
calls (right or wrong); a policy taught only two-call rows answers a row that wants three or four with two. The
**first call alone** on the rows that want one call where the answer made several calls, all readable: the share BFCL's checker would
accept had the answer stopped after its first call, so what a policy's extra calls cost (the evaluation itself judges the whole
answer). And the **no-call rows by shared subject words**:
on the rows whose right answer is no call, the share answered with none, apart for the rows whose
question shares no subject word with the functions (:func:`bfcl.shared_subject_words`),
one, or more: a near miss ("the dominant trait of a lion" with ``genetics.get_variant_frequency``) is
where a policy that learnt to call calls wrongly.

:func:`mistakes_markdown` is what a recipe's report appends for ``data_source: bfcl`` rows
(``posttrain recipe bfcl``) and what ``scripts/bfcl_errors.py`` prints.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.rewards import bfcl
from posttrain.rewards.episodes_file import source_rows

if TYPE_CHECKING:
    from posttrain.models.tool_formats import CallParser

RIGHT, NO_CALL = "right", "no call"
KINDS = {
    "wrong_func_name": "wrong function", "wrong_count": "wrong number of calls", "missing_required": "missing parameter",
    "missing_optional": "missing optional param",  # left out, but the possible answer has no "" (omit) for it
    "unexpected_param": "unexpected parameter", "decoder_success": "call on irrelevance row",
    "decoder_failed": NO_CALL, "decoder_wrong_output_format": "unreadable call",
}
CALL_RATE = "call rate where one is due"
CALLS_RIGHT = "calls right where one is due"
ARGUMENTS = "arguments per call where one is due"
CALLS_PER_ANSWER = "calls per answer where one is due"
SHARED = ("none", "one", "two or more")  # subject words a no-call row's question shares with its functions
WANTED = ("1", "2", "3", "4 or more")  # calls a possible answer has
FIRST_ALONE = "first call alone"  # a one-call row answered with several calls: would its first call pass


def kind(verdict: bfcl.Verdict) -> str:
    """One of a few readable kinds for BFCL's error type (the parallel checker's hidden one where it hides it)."""
    if verdict.valid:
        return RIGHT
    hidden = verdict.error_type.endswith("cannot_find_match") and verdict.sub_error_types
    error = verdict.sub_error_types[0] if hidden else verdict.error_type
    prefix, _, name = error.partition(":")
    if prefix in ("value_error", "type_error") or name.startswith(("value_error", "type_error")):
        return "wrong value or type"
    return KINDS.get(name, error)


def judge(row: Mapping, parser: CallParser) -> tuple[str, list[dict]]:
    """The answer's kind of mistake (or "right"), and its readable calls (``{"name", "arguments"}``;
    an unreadable answer's readable ones, if any)."""
    messages = row["messages"]
    text = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
    turn = parser(text)
    calls = [{"name": call.name, "arguments": json.loads(call.arguments or "{}")} for call in turn.calls]
    if turn.malformed:
        return "unreadable call", calls
    if not calls and not bfcl.is_no_call_category(row["extra_info"]["category"]):
        return NO_CALL, calls
    return kind(bfcl.check_calls(calls, row["ground_truth"], row["extra_info"])), calls


def episode_rows(path: Path) -> list[dict]:
    """The BFCL rows of an episodes file; an InputError naming the line of one that is not an episode row."""
    return source_rows(path, bfcl.DATA_SOURCE, ("messages", "extra_info.category"), "BFCL")


def mistakes_markdown(files: Mapping[str, Path]) -> str:
    """Markdown: the call rates, calls right, arguments per call and calls per answer (evaluations × categories, then all),
    the no-call rows by shared words, and per category (then all) each kind's count for each evaluation.
    ``files``: label → episodes file; rows of other data sources (a mixture's) are left out."""
    kinds, calls, shared, wanted = _tally(files)
    if not kinds:
        return ""
    labels = list(files)
    categories = [*sorted(set(kinds) - {"all"}), "all"]
    due = [c for c in categories if any(calls[c][label]["due"] for label in labels)]
    lines = _due_lines(calls, due, labels) + _wanted_lines(wanted, labels) + _shared_lines(shared, labels)
    for category in categories:
        by_label = kinds[category]
        names = sorted({k for counts in by_label.values() for k in counts}, key=lambda k: (k != RIGHT, k))
        sizes = [sum(by_label[label].values()) for label in labels]
        size = f"{sizes[0]} rows" if len(set(sizes)) == 1 else "rows: " + ", ".join(map(str, sizes))
        lines += ["", f"{category} ({size}), mistakes by kind:", "",
                  "| kind | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        lines += [f"| {name} | " + " | ".join(str(by_label[label][name]) for label in labels) + " |" for name in names]
        if category in due:
            lines.append(f"| {CALL_RATE} | " + " | ".join(_rate(calls[category][label]) for label in labels) + " |")
    return "\n".join(lines).strip("\n")


Tally = dict[str, dict[str, Counter]]


def _tally(files: Mapping[str, Path]) -> tuple[Tally, Tally, Tally, Tally]:
    """Each file's rows judged: category → label → kind counts; category → label → due, made, right,
    calls, arguments (rows that need a call; of them, with a readable call; accepted; their readable calls and
    those calls' arguments); label → shared-words bucket → {right: rows} for the no-call rows; label → calls-wanted
    bucket → {exact: rows} for the rows that need a call and made a readable one, and label → :data:`FIRST_ALONE` →
    {first call accepted: rows} for the one-call rows answered with several calls, all readable."""
    from posttrain.models.tool_formats import CallParser

    parser = CallParser("hermes", None, [])
    kinds: Tally = defaultdict(lambda: defaultdict(Counter))
    calls: Tally = defaultdict(lambda: defaultdict(Counter))
    shared: Tally = defaultdict(lambda: defaultdict(Counter))
    wanted: Tally = defaultdict(lambda: defaultdict(Counter))
    for label, path in files.items():
        for row in episode_rows(path):
            found, made = judge(row, parser)
            due = not bfcl.is_no_call_category(row["extra_info"]["category"])
            if not due:
                shared[label][_shared(row)][found == RIGHT] += 1
            elif made:
                asked = len(json.loads(row["ground_truth"]))
                wanted[label][WANTED[min(asked, len(WANTED)) - 1]][len(made) == asked] += 1
                if asked == 1 and len(made) > 1 and found != "unreadable call":  # else the first call written may be unread
                    wanted[label][FIRST_ALONE][bfcl.check_calls(made[:1], row["ground_truth"], row["extra_info"]).valid] += 1
            for category in (row["extra_info"]["category"], "all"):
                kinds[category][label][found] += 1
                if due:
                    calls[category][label].update(due=1, made=bool(made), right=bool(made) and found == RIGHT, calls=len(made),
                                                  arguments=sum(len(c["arguments"]) for c in made if isinstance(c["arguments"], dict)))
    return kinds, calls, shared, wanted


def _due_lines(calls: Tally, due: list[str], labels: list[str]) -> list[str]:
    """The four tables over the rows that need a call (module docstring); none without such rows."""
    if not due:
        return []
    tables = [(CALL_RATE, "the share of rows that need a call on which the answer made a readable call", "made", "due"),
              (CALLS_RIGHT, "of the rows that need a call on which the answer made a readable call, the share BFCL's "
               "checker accepts", "right", "made"),
              (ARGUMENTS, "on the rows that need a call, the mean number of arguments a readable call wrote", "arguments", "calls"),
              (CALLS_PER_ANSWER, "on the rows that need a call on which the answer made a readable call, the mean number of "
               "readable calls", "calls", "made")]
    lines: list[str] = []
    for title, what, part, whole in tables:
        lines += ["", f"{title.capitalize()} ({what}):", "", "| | " + " | ".join(due) + " |", "|---" * (len(due) + 1) + "|"]
        lines += [f"| {label} | " + " | ".join(_rate(calls[c][label], part, whole) for c in due) + " |" for label in labels]
    return lines


def _shared(row: Mapping) -> str:
    """How many subject words the row's question (its user turns) shares with its functions, as one of :data:`SHARED`."""
    functions = row["extra_info"].get("bfcl_functions")
    functions = json.loads(functions) if isinstance(functions, str) else functions or []
    return SHARED[min(len(bfcl.shared_subject_words(row["messages"], functions)), 2)]


def _shared_lines(shared: Mapping[str, Mapping[str, Counter]], labels: list[str]) -> list[str]:
    """The no-call rows' table (module docstring); none without such rows."""
    if not shared:
        return []
    lines = ["", "No-call rows by the subject words their question shares with the functions (the share answered "
             "with no call):", "", "| | " + " | ".join(SHARED) + " |", "|---" * (len(SHARED) + 1) + "|"]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(_share(shared[label][bucket]) for bucket in SHARED) + " |")
    return lines


def _wanted_lines(wanted: Mapping[str, Mapping[str, Counter]], labels: list[str]) -> list[str]:
    """The right number of calls by calls wanted, then the first call alone (module docstring); none without such rows
    (the second table none where no answer made several calls on a one-call row)."""
    if not wanted:
        return []
    lines = ["", "Right number of calls by calls wanted (on the rows that need a call on which the answer made a readable "
             "call, by the calls the possible answer has, the share with exactly that many readable calls):", "",
             "| | " + " | ".join(WANTED) + " |", "|---" * (len(WANTED) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(_share(wanted[label][bucket]) for bucket in WANTED) + " |" for label in labels]
    if not any(wanted[label][FIRST_ALONE] for label in labels):
        return lines
    return lines + ["", "First call alone where one call is wanted (on the rows whose possible answer has one call and whose "
                    "answer made several calls, all readable, the share BFCL's checker accepts from the first call alone; the "
                    "evaluation judges the whole answer):", "", f"| | {FIRST_ALONE} |", "|---|---|",
                    *(f"| {label} | {_share(wanted[label][FIRST_ALONE])} |" for label in labels)]


def _share(counts: Counter) -> str:
    """True's share of a {True: n, False: m} count, with its n; a dash for none."""
    return f"{counts[True] / (counts[True] + counts[False]):.3f} (n={counts[True] + counts[False]})" if counts[True] + counts[False] else "—"


def _rate(counts: Counter, part: str = "made", whole: str = "due") -> str:
    return f"{counts[part] / counts[whole]:.3f}" if counts[whole] else "—"
