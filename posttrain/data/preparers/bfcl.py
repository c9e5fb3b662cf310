"""BFCL's single-turn function-calling questions as RL rows and SFT transcripts (``posttrain prepare bfcl``).

The questions, functions and possible answers are the installed ``bfcl-eval`` package's own files
(``bfcl_eval/data/BFCL_v4_<category>.json`` and ``possible_answer/``; Apache-2.0; installed with
``--no-deps``, see :mod:`posttrain.rewards.bfcl`), read as they are. Default split: train on the live
categories (``live_simple, live_multiple, live_parallel, live_parallel_multiple, live_irrelevance``,
user-contributed), hold out the non-live Python ones (``simple_python`` 400, ``multiple`` 200,
``parallel`` 200, ``parallel_multiple`` 200, ``irrelevance`` 240), as BFCL reports them. Options
``train_categories`` / ``test_categories`` (comma lists) choose others among :data:`CATEGORIES`.

One RL row per question (data_source ``bfcl``, scored by BFCL's AST checker):

- ``prompt``: the question's first (only) turn, its chat messages as they are;
- ``reward_model.ground_truth``: JSON text of BFCL's possible answer (``"[]"`` for (ir)relevance rows);
- ``extra_info``: ``split``, ``index``, ``id`` (BFCL's), ``category``, ``tools`` (JSON text of the
  functions as OpenAI tool schemas, :func:`tool_schemas`) and ``bfcl_functions`` (JSON text of BFCL's
  own docs, whose types the checker reads). Both are text because rows' schemas differ. A training row
  with an SFT transcript also has ``reference_answer``, the transcript's assistant turn (the answer
  ``algorithm.guidance`` gives a group of answers with none right: posttrain/rollout/guidance.py).

BFCL's types become JSON Schema through BFCL's own table (``bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI``:
``dict`` → object, ``float`` → number, ``tuple`` → array, ``any`` → string, as BFCL's checker wants a
string for ``any``), through ``properties`` and ``items`` at every depth; BFCL's own ``optional`` flag
is dropped (``required`` says it), every other key (description, enum, default, required) is kept.
Function names keep their dots (``math.factorial``): the checker is told the model writes them as given.

``max_prompt_tokens`` drops the training rows whose prompt, rendered with its tools as posttrain renders
it (``tokenize_prompts``), is longer, with ``tokenizer`` (default: the default model's); held-out rows
are never dropped (their longest is reported). ``rl_prompt_tokens=N`` (above ``max_prompt_tokens``) keeps the
training rows whose prompt is longer than ``max_prompt_tokens`` but within N as RL rows alone (``extra_info.rl_only``
true, ``in_sft`` false, after every other row): no SFT transcript (so no ``reference_answer`` for ``algorithm.guidance``),
no added row drawn from them, never a development row (``data.dev_size`` skips them; ``joined_values`` renames them as
it does the others), so the SFT transcripts, the questions SFT holds back and the development split are those of
``max_prompt_tokens`` alone, while an RL stage trains on the longer prompts too (live_multiple's functions run long:
the report counts the rows each cap keeps). It cannot be given with ``no_call_share`` (whose draw it would change);
``data.sampler.shares`` sets the no-call rows' share of a batch.
``limit`` keeps the first N questions of each category.
``no_call_share`` keeps at most that share of training rows whose answer is no call (live_irrelevance is
46 % of the capped training rows; GRPO on them all learnt to call nothing within two steps), a seeded draw,
the rest dropped and counted; the SFT transcripts come from the rows kept. ``parallel_pairs=N`` adds N
training rows of category ``synthetic_parallel`` (the capped training split keeps 27 rows that ask for
several calls): each is two live_simple questions with the same functions, both taught by SFT, asked in
one user message; its answer is both possible answers, judged by BFCL's parallel rule, and it has its
SFT transcript (both calls). A seeded draw of distinct pairs; prompts over ``max_prompt_tokens`` are
left out. ``swapped_irrelevance=N`` adds N training rows of category ``swapped_irrelevance``, irrelevance
rows that look like the rows that need a call: a taught live_simple or live_multiple question (one user
message) asked with another taught question's functions that share no subject word with its own functions
or its question (the words of the functions' names, the longer words of their descriptions and of the
question, common ones left out: ``get_weather`` and ``weather.forecast`` share "weather"). No call is right (BFCL's
irrelevance rule, chosen by "irrelevance" in the category name) and its SFT transcript says no function
fits, so the call decision has to read the functions, not only the question. A seeded draw of distinct
questions; prompts over ``max_prompt_tokens`` are left out. The development candidates (``in_sft`` false)
are unchanged by both. ``dev_swapped=N`` writes ``dev_swapped.parquet``: up to N rows made the same way from
the questions SFT holds back for validation (``sft_val_size``), each asked with another of those questions'
functions, so that neither the question nor the functions were taught. They are in no training file: evaluate on
them with ``data.val_files=[dev_swapped.parquet]``, or validate an RL run on them beside its development rows
with ``data.dev_files=[dev_swapped.parquet]``. They test whether the call decision reads the functions, as
BFCL's held-out ``irrelevance`` rows do (a question asked with an unrelated function), on the training split.
``masked_irrelevance=N`` adds N training rows of category ``masked_irrelevance``: a taught live_multiple question (one
user message) asked with its own functions less those its possible answer calls and less their namesakes (a name
sharing a word with theirs, trailing digits and common verbs such as ``get`` aside: ``uber.ride2`` goes with
``uber.ride``, and ``Events_3_FindEvents`` takes every ``Events_*`` function with it); a question with none left is
skipped. What is left is the question's own bundle of functions less the service it needs: for the many
``Service_N_Action`` names the bundle's other services, for others often the same app's other functions on the same
subject, as in BFCL's held-out irrelevance rows (``run_microwave`` for "preheat the oven"), where swapped rows share no
subject word. No call is right
and its SFT transcript says so; a kept function that could do the job under another name makes a wrong label, which
the name rule does not catch. ``dev_masked=N`` writes ``dev_masked.parquet`` the same way from the questions SFT holds
back, for validation only, like ``dev_swapped``. ``dev_pairs=N`` writes ``dev_pairs.parquet``: up to N two-call rows of
category ``synthetic_parallel_multiple`` from the questions SFT holds back (the development split holds 2 rows that ask
for several calls, against the held-out set's 400): two held-back live_simple or live_multiple questions asked in one
message with both questions' functions, their answer both calls (BFCL's parallel rule), as BFCL's parallel_multiple rows
are; the held-back questions seldom share their functions, so the pairs do not (as ``parallel_pairs``' do). For
validation only. ``union_pairs=N`` adds up to N training rows made the same way from taught questions, each pair's
second question bringing functions of its own (in train and SFT, category ``synthetic_parallel_multiple`` too): the
capped training split keeps 11 live_parallel_multiple rows. ``most_calls=K`` (default 2) makes each ``parallel_pairs`` and
``union_pairs`` row ask 2 to K questions at once (a seeded even draw of the number; the questions past the first two
drawn as the second was; rows over the prompt cap left out, so long ones are fewer): BFCL's held-out parallel and
parallel_multiple rows ask for 2 to 4 calls, and a model taught only two-call pairs answers most of them with two.
``dev_most_calls=K`` (default 2) does the same for ``dev_pairs`` (and ``dev_values``), so that a development split can tell whether training
taught the number of calls (the held-out rows' 3- and 4-call answers). The dev rows bring the functions of every
question they ask, so few of three or four questions fit the training rows' cap: ``dev_prompt_tokens=N`` caps the
``dev_`` rows (validation, like the held-out rows, which are not capped) at N prompt tokens in place of
``max_prompt_tokens``; keep it within ``data.max_prompt_length``.
``distractors=N`` adds up to N training rows of category ``synthetic_multiple`` (in train and SFT; BFCL's multiple rule):
a taught live_simple question (one function, one call) asked with its function among 1 to 3 functions of other taught
questions (a seeded even draw of the number; a row over the prompt cap offers one fewer, so long ones are fewer; the
order shuffled), answered by its own call, as BFCL's held-out ``multiple`` rows offer 2 to 4 functions of which one is
right. Functions sharing a subject word with its own come first (a ``multiple`` row's functions are about one
subject); none whose name shares a word with its own function's name (common verbs and trailing digits aside) or with
its question, nor one whose subject words hold its question's longer words, so that a second function able to do the
job is rare (a wrong label, not caught otherwise). The report says how many the capped split yields (one per taught
live_simple question at most). ``dev_distractors=N`` writes ``dev_distractors.parquet`` from the questions SFT holds back
(their added functions drawn from every question's), for validation only.
``multi_value=N`` adds up to N training rows of category ``synthetic_parallel_values`` (in train and SFT; BFCL's parallel
rule), as BFCL's held-out ``parallel`` rows ask one function for several values where the pairs ask several questions: a
taught question that writes one of its call's argument values asked for 2 to ``most_calls`` values of it, one call per
value (which values, and what is left out so the label stays right: :func:`~posttrain.data.preparers.bfcl_added.multi_value`).
``values_from`` (a comma list, default ``live_simple``; ``live_simple,live_multiple`` doubles the questions to draw from;
a live_multiple question keeps its functions) says which taught questions are asked so. ``dev_values=N`` writes
``dev_values.parquet`` the same way from the questions SFT holds back, asking 2 to ``dev_most_calls`` values, for
validation only: the development split's stand-in for BFCL's parallel rows, which ``dev_pairs`` (several questions) is not.
``outside_irrelevance=N`` adds N training rows of category ``outside_irrelevance``: a GSM8K word problem (train split, the
copy shipped with posttrain) asked with a taught question's functions that share no subject word with it and do no
arithmetic by name or description (:func:`~posttrain.data.preparers.bfcl_added.outside`); no call is right and its SFT transcript says so. BFCL's
held-out ``irrelevance`` rows ask questions of a kind no training category asks (a computation in words, one function
about something else), where the swapped rows ask live ones. ``dev_outside=N`` writes ``dev_outside.parquet`` from GSM8K's
test problems and the functions of the questions SFT holds back, for validation only.
The row-making code is :mod:`posttrain.data.preparers.bfcl_added`.
``near_irrelevance=true`` gives the live_irrelevance training questions that share a subject word with their
functions (near misses, where RL learns to call wrongly: docs/bfcl_runs.md) the category ``live_irrelevance_near``, so a
batch can hold a share of them (``data.sampler.shares``) and a development split reports them apart; nothing else
about them changes (BFCL's irrelevance rule still judges them), and the held-out rows keep their categories.
``joined_values=true`` does the same for the one-call training questions that join two arguments' values with "and" ("a base
of 10 units and height of 5 units": :func:`~posttrain.data.preparers.bfcl_added.joins_values`), the shape ``multi_value``'s
rows list one argument's values in, though answered by one call: their category gains ``_joined`` (``live_simple_joined``,
``live_multiple_joined``; BFCL's rule, read from the name, unchanged), after the added rows are drawn, which stay the same.

SFT transcripts (``sft.parquet``, ``sft_val.parquet``: the names ``posttrain sft`` looks for beside the
RL data; columns ``messages`` and the row's ``extra_info``, so a transcript carries its tools) come
from the kept training rows: the prompt, then
one assistant turn with each call of the possible answer (:func:`~posttrain.rewards.bfcl.answer_calls`:
the first acceptable value of each parameter) as a hermes block ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>``, newline-separated. Each is checked by BFCL's checker first; the few possible
answers no call can satisfy are reported and left out. An irrelevance row's answer is
:data:`NO_FUNCTION_ANSWER`; a ``live_relevance`` row has no answer to write and is left out.
``sft_val_size`` transcripts, drawn with ``seed`` before ``no_call_share``'s cut (so a preset with the cut holds
back the same questions as one without), are held back for SFT validation. Those rows stay in the RL
``train.parquet`` with ``extra_info.in_sft`` false; every row an SFT transcript teaches has it true, so
``data.dev_size`` holds back only questions the SFT warm-up never saw (the RL runs' development split).
``README.md`` records the source and the report, which is also printed.

**Multi-turn** (``multi_turn``, default ``multi_turn_base``, 200 questions; ``multi_turn=`` for none):
``test_multi_turn.parquet``, one row per question (data_source ``bfcl_multi_turn``), played with
``env.options.answer: turns`` and the tool class ``posttrain.tools.bfcl_multi_turn:BfclMultiTurn``, whose
``reward()`` is BFCL's multi-turn checker (docs/tools.md "BFCL multi-turn"). A row's functions are its
involved classes' (BFCL's ``populate_test_cases_with_predefined_functions``, as BFCL's runner tells them):

- ``prompt``: the first user turn's messages;
- ``reward_model.ground_truth``: JSON text of BFCL's possible answer (per user turn, call strings such
  as ``"cd(folder='document')"``);
- ``extra_info``: ``split`` (``test``), ``index``, ``id``, ``category``, ``later_turns`` (JSON text: the
  user turns after the first, each a list of messages), ``initial_config`` and ``involved_classes``
  (JSON text, as BFCL gives them) and ``tools`` (JSON text, OpenAI tool schemas as above).

Only ``multi_turn_base`` is offered: ``miss_func`` adds functions in later turns, and ``miss_param`` /
``long_context`` have not been replayed through the episode yet. ``limit`` applies to it too.
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from posttrain.data.format import IN_SFT, REFERENCE_ANSWER, RL_ONLY, make_row, write_rows
from posttrain.data.preparers import bfcl_added as added_rows
from posttrain.data.preparers.bfcl_report import Report, readme
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError
from posttrain.models import DEFAULT_MODEL, load_tokenizer, tokenize_prompts
from posttrain.models.tool_formats.builtin import tool_calls_text
from posttrain.rewards import bfcl

DATA_SOURCE = "bfcl"
ABILITY = "function_calling"
TRAIN_CATEGORIES = "live_simple,live_multiple,live_parallel,live_parallel_multiple,live_irrelevance"
TEST_CATEGORIES = "simple_python,multiple,parallel,parallel_multiple,irrelevance"
# BFCL's single-turn Python categories: judged by its AST checker, or by whether a call was made
MULTI_TURN_DATA_SOURCE = "bfcl_multi_turn"
MULTI_TURN_CATEGORIES = ("multi_turn_base",)
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple", "live_multiple",
              "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance")
NO_FUNCTION_ANSWER = "None of the functions I have can do this."
_DROPPED_KEYS = ("optional",)  # BFCL's own flag, not JSON Schema
# near_irrelevance: the training rows of this category whose question shares a subject word with its functions
NEAR_FROM, NEAR_CATEGORY = "live_irrelevance", "live_irrelevance_near"


@dataclass(frozen=True)
class Question:
    """One BFCL question: its first turn's messages, its functions (BFCL's docs) and possible answer."""

    id: str
    category: str
    messages: list[dict[str, str]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, Any]]  # [] for (ir)relevance categories


def json_schema(schema: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    """BFCL's parameter schema as JSON Schema, its type names through ``types`` (BFCL's
    ``GORILLA_TO_OPENAPI``; a name it lacks becomes ``string``, as BFCL's own conversion does)."""
    converted = {key: value for key, value in schema.items() if key not in _DROPPED_KEYS}
    if "type" in schema:
        converted["type"] = types.get(schema["type"], "string")
    if isinstance(schema.get("properties"), dict):
        converted["properties"] = {name: json_schema(sub, types) for name, sub in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        converted["items"] = json_schema(schema["items"], types)
    return converted


def tool_schemas(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's function docs as OpenAI tool schemas ``{"type": "function", "function": {...}}``."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # importable without bfcl-eval's dependencies

    return [{"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                              "parameters": json_schema(doc["parameters"], GORILLA_TO_OPENAPI)}}
            for doc in functions]


def load_category(category: str, limit: int | None = None) -> list[Question]:
    """The questions of one BFCL category (the first ``limit`` of them), with their possible answers."""
    data = bfcl.data_dir()
    rows = _read_jsonl(data / f"BFCL_v4_{category}.json")[:limit]
    answers = [] if bfcl.is_no_call_category(category) else _read_jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")
    truth = {answer["id"]: answer["ground_truth"] for answer in answers}
    return [Question(row["id"], category, [{"role": m["role"], "content": m["content"]} for m in row["question"][0]],
                     row["function"], truth[row["id"]] if answers else []) for row in rows]


def transcript(question: Question) -> list[dict[str, str]] | None:
    """The SFT conversation for ``question`` (module docstring), or None when its answer cannot be written."""
    if "irrelevance" in question.category:
        return [*question.messages, {"role": "assistant", "content": NO_FUNCTION_ANSWER}]
    if bfcl.is_no_call_category(question.category):
        return None
    extra_info = {"category": question.category, "bfcl_functions": question.functions}
    calls = bfcl.answer_calls(question.ground_truth, question.functions)
    if not bfcl.check_calls(calls, question.ground_truth, extra_info).valid:
        return None
    return [*question.messages, {"role": "assistant", "content": tool_calls_text(calls)}]


def prepare_bfcl(
    out_dir: Path,
    *,
    train_categories: str = TRAIN_CATEGORIES,
    test_categories: str = TEST_CATEGORIES,
    max_prompt_tokens: int | None = None,
    rl_prompt_tokens: int | None = None,
    tokenizer: str = DEFAULT_MODEL,
    limit: int | None = None,
    sft_val_size: int = 64,
    seed: int = 0,
    multi_turn: str = "multi_turn_base",
    no_call_share: float | None = None,
    parallel_pairs: int = 0, union_pairs: int = 0, most_calls: int = 2,
    swapped_irrelevance: int = 0, dev_swapped: int = 0,
    masked_irrelevance: int = 0, dev_masked: int = 0, distractors: int = 0, dev_distractors: int = 0, multi_value: int = 0, dev_values: int = 0,
    outside_irrelevance: int = 0, dev_outside: int = 0,
    values_from: str = added_rows.VALUES_FROM[0],
    dev_pairs: int = 0, dev_most_calls: int = 2, dev_prompt_tokens: int | None = None,
    near_irrelevance: bool = False, joined_values: bool = False,
) -> list[Path]:
    """Write ``train.parquet``, ``test.parquet``, ``sft.parquet``, ``sft_val.parquet``, ``test_multi_turn.parquet`` (unless
    ``multi_turn`` is empty) and ``README.md`` into ``out_dir`` (module docstring); prints the report, returns the paths."""
    splits, made = checked_options(dict(locals()))  # every refusal the options alone call for, before a file is read
    multi_turn_questions = [q for c in _categories(multi_turn, "multi_turn", MULTI_TURN_CATEGORIES, empty=True) for q in load_multi_turn(c, limit)]
    values_from = _categories(values_from, "values_from", added_rows.VALUES_FROM)
    questions = {split: [q for c in categories for q in load_category(c, limit)] for split, categories in splits.items()}
    questions["train"] = _near_misses(questions["train"], splits["train"]) if near_irrelevance else questions["train"]
    report = Report(splits, {split: Counter(q.category for q in items) for split, items in questions.items()},
                    {split: {doc["name"] for q in items for doc in q.functions} for split, items in questions.items()})
    questions["train"], rl_only = _drop_long(questions, max_prompt_tokens, tokenizer, report, rl_prompt_tokens)
    written = {q.id: t for q in questions["train"] if (t := transcript(q)) is not None}
    report.unwritten = [q.id for q in questions["train"] if q.id not in written and not bfcl.is_no_call_category(q.category)]
    if sft_val_size >= len(written):
        raise InputError(f"sft_val_size={sft_val_size} leaves no SFT training transcript of the {len(written)} written; lower it")
    # drawn before no_call_share's cut, so that the SFT preset and the RL preset (which cuts) hold back the same questions
    held = set(random.Random(seed).sample(list(written), sft_val_size))
    if no_call_share is not None:
        questions["train"] = _cap_no_call(questions["train"], no_call_share, seed, report)
    cap = max_prompt_tokens and (max_prompt_tokens, tokenizer)
    added = _added(questions["train"], written, held, seed, made, report, cap=cap, most_calls=most_calls, dev_most_calls=dev_most_calls,
                   values_from=tuple(values_from), dev_cap=cap if dev_prompt_tokens is None else (dev_prompt_tokens, tokenizer))
    # the RL-only rows go last, after every draw above (which they leave as it was), so the other rows keep their index
    capped_end = len(questions["train"])
    questions["train"] = _joined(questions["train"] + rl_only, report) if joined_values else questions["train"] + rl_only
    questions["train"][capped_end:capped_end] = [q for option in added_rows.TRAIN_OPTIONS for q in added[option]]
    written |= {q.id: conversation for option in added_rows.TRAIN_OPTIONS for q in added[option] if (conversation := transcript(q))}
    rl_ids = {q.id for q in rl_only}
    rows = {split: [_row(q, split, i, written if split == "train" else {}, held, rl_only=q.id in rl_ids) for i, q in enumerate(items)]
            for split, items in questions.items()}
    sft = [({"messages": written[q.id], "extra_info": row["extra_info"]}, q.id in held)
           for q, row in zip(questions["train"], rows["train"]) if q.id in written]
    report.sft_sizes = (sum(not h for _, h in sft), sum(h for _, h in sft))
    dev = {option: [_row(q, "dev", i, {}, held) for i, q in enumerate(added[option])]
           for option in made if option.startswith("dev_") and made[option]}
    return _write(Path(out_dir), rows, sft, dev, multi_turn_questions, report)


def _write(out_dir: Path, rows: dict[str, list[dict[str, Any]]], sft: list[tuple[dict[str, Any], bool]],
           dev: dict[str, list[dict[str, Any]]], multi_turn_questions: list[dict[str, Any]], report: Report) -> list[Path]:
    """The files ``prepare_bfcl`` writes (the SFT transcripts split by whether they are held back, the ``dev_`` rows per option)."""
    paths = [write_rows(rows[split], out_dir / f"{split}.parquet") for split in ("train", "test")]
    paths.append(write_rows([row for row, h in sft if not h], out_dir / "sft.parquet"))
    paths.append(write_rows([row for row, h in sft if h], out_dir / "sft_val.parquet"))
    paths += [write_rows(dev_rows, out_dir / f"{option}.parquet") for option, dev_rows in dev.items()]
    paths += _write_multi_turn(multi_turn_questions, out_dir, report)
    (out_dir / "README.md").write_text(readme(report.text()), encoding="utf-8")
    print(report.text())
    return paths


def _added(train: list[Question], written: dict[str, Any], held: set[str], seed: int, made: dict[str, int], report: Report, *,
           cap: tuple[int, str] | None, dev_cap: tuple[int, str] | None, most_calls: int, dev_most_calls: int,
           values_from: tuple[str, ...] = added_rows.VALUES_FROM[:1]) -> dict[str, list[Question]]:
    """The rows the options in ``made`` (option → how many) make (module docstring), per option, counted in ``report``.
    The training rows come from taught questions, the ``dev_`` rows from those SFT holds back; ``cap`` and ``dev_cap``
    are their prompt caps (tokens, tokenizer), ``most_calls`` and ``dev_most_calls`` the most questions a training
    pair and a ``dev_pairs`` row ask, ``values_from`` the categories ``multi_value`` asks."""
    tokenizer = functools.cache(load_tokenizer)  # loaded when a row is first measured

    def over(limit: tuple[int, str] | None) -> added_rows.TooLong:
        return lambda question: bool(limit) and _prompt_length(question, tokenizer(limit[1])) > limit[0]

    too_long, dev_too_long = over(cap), over(dev_cap)

    with_calls = [q for q in train if q.id in written and not bfcl.is_no_call_category(q.category)]
    taught, validated = [q for q in with_calls if q.id not in held], [q for q in with_calls if q.id in held]
    added = {
        "parallel_pairs": added_rows.parallel_pairs(train, set(written) - held, made["parallel_pairs"], seed,
                                                    lambda q: too_long(q) or transcript(q) is None, most_calls=most_calls),
        "union_pairs": added_rows.parallel_pairs(train, set(written) - held, made["union_pairs"], seed,
                                                 lambda q: too_long(q) or transcript(q) is None, same_functions=False,
                                                 both_bring_functions=True, most_calls=most_calls),
        "swapped_irrelevance": added_rows.swapped(taught, made["swapped_irrelevance"], seed, too_long),
        "dev_swapped": added_rows.swapped(validated, made["dev_swapped"], seed, dev_too_long),
        "masked_irrelevance": added_rows.masked(taught, made["masked_irrelevance"], seed, too_long),
        "dev_masked": added_rows.masked(validated, made["dev_masked"], seed, dev_too_long),
        "dev_pairs": added_rows.parallel_pairs(validated, {q.id for q in validated}, made["dev_pairs"], seed, dev_too_long,
                                               same_functions=False, most_calls=dev_most_calls),
        "distractors": added_rows.distractors(taught, taught, made["distractors"], seed, lambda q: too_long(q) or transcript(q) is None),
        "dev_distractors": added_rows.distractors(validated, with_calls, made["dev_distractors"], seed, dev_too_long),
        "multi_value": added_rows.multi_value(taught, taught, made["multi_value"], seed, lambda q: too_long(q) or transcript(q) is None,
                                              most_calls=most_calls, kinds=values_from),
        "dev_values": added_rows.multi_value(validated, with_calls, made["dev_values"], seed, dev_too_long, most_calls=dev_most_calls,
                                             kinds=values_from),
        "outside_irrelevance": added_rows.outside("train", taught, made["outside_irrelevance"], seed, too_long),
        "dev_outside": added_rows.outside("test", validated, made["dev_outside"], seed, dev_too_long),
    }
    report.made = {option: (len(rows), made[option], Counter(len(q.ground_truth) for q in rows)) for option, rows in added.items() if made[option]}
    return added


def load_multi_turn(category: str, limit: int | None = None) -> list[dict[str, Any]]:
    """BFCL's questions of a multi-turn category as BFCL's runner sees them (``function``: the involved
    classes' docs), each with its ``ground_truth`` and ``category``."""
    questions = bfcl.bfcl_module("bfcl_eval.utils").populate_test_cases_with_predefined_functions(
        _read_jsonl(bfcl.data_dir() / f"BFCL_v4_{category}.json")[:limit])
    truth = {answer["id"]: answer["ground_truth"] for answer in _read_jsonl(bfcl.data_dir() / "possible_answer" / f"BFCL_v4_{category}.json")}
    return [{**question, "ground_truth": truth[question["id"]], "category": category} for question in questions]


def multi_turn_row(question: dict[str, Any], index: int) -> dict[str, Any]:
    """A multi-turn question as a row (module docstring)."""
    extra_info = {"split": "test", "index": index, "id": question["id"], "category": question["category"],
                  "later_turns": json.dumps(question["question"][1:], ensure_ascii=False),
                  "initial_config": json.dumps(question["initial_config"], ensure_ascii=False),
                  "involved_classes": json.dumps(question["involved_classes"]),
                  "tools": json.dumps(tool_schemas(question["function"]), ensure_ascii=False)}
    messages = [{"role": m["role"], "content": m["content"]} for m in question["question"][0]]
    return make_row(data_source=MULTI_TURN_DATA_SOURCE, messages=messages, ground_truth=json.dumps(question["ground_truth"], ensure_ascii=False),
                    ability=ABILITY, extra_info=extra_info)


def _categories(text: str, option: str, offered: tuple[str, ...] = CATEGORIES, *, empty: bool = False) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in offered]
    kind = "multi-turn categories offered here" if empty else "single-turn Python categories" if offered == CATEGORIES else "categories offered here"
    if unknown or not (names or empty):
        raise InputError(f"{option}={text!r}: {unknown or 'no category'} not among BFCL's {kind}; "
                         f"give a comma list of {', '.join(offered)}" + (f" (or {option}= for none)" if empty else ""))
    return names


def checked_options(given: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """(the train and test categories, the counts of added rows) from prepare_bfcl's arguments, once every refusal
    the options alone call for has passed (also ``preparers.check_options``'s, so that a recipe refuses a stage's
    options before it runs)."""
    splits = {split: _categories(given[f"{split}_categories"], f"{split}_categories") for split in ("train", "test")}
    _categories(given["multi_turn"], "multi_turn", MULTI_TURN_CATEGORIES, empty=True)
    _categories(given["values_from"], "values_from", added_rows.VALUES_FROM)
    made = {name: given[name] for name in ("parallel_pairs", "union_pairs", "swapped_irrelevance", "dev_swapped", "masked_irrelevance",
                                           "dev_masked", "dev_pairs", "distractors", "dev_distractors", "multi_value", "dev_values",
                                           "outside_irrelevance", "dev_outside")}
    _check_options(splits, given["max_prompt_tokens"], given["limit"], given["sft_val_size"], given["no_call_share"], made,
                   given["most_calls"], given["dev_most_calls"], given["dev_prompt_tokens"], given["rl_prompt_tokens"])
    return splits, made


def _check_options(splits: dict[str, list[str]], max_prompt_tokens: int | None, limit: int | None, sft_val_size: int,
                   no_call_share: float | None, made: dict[str, int], most_calls: int = 2, dev_most_calls: int = 2,
                   dev_prompt_tokens: int | None = None, rl_prompt_tokens: int | None = None) -> None:
    both = sorted(set(splits["train"]) & set(splits["test"]))
    if both:
        raise InputError(f"{both} are in both train_categories and test_categories; a held-out category must not be trained on")
    optional = {"max_prompt_tokens": max_prompt_tokens, "limit": limit, "dev_prompt_tokens": dev_prompt_tokens,
                "rl_prompt_tokens": rl_prompt_tokens}
    check_counts(1, **{k: v for k, v in optional.items() if v is not None})
    check_counts(0, sft_val_size=sft_val_size, **made)
    check_counts(2, most_calls=most_calls, dev_most_calls=dev_most_calls)
    if no_call_share is not None and not 0 < no_call_share <= 1:
        raise InputError(f"no_call_share={no_call_share}: give the largest share of training rows whose answer is no call, in (0, 1]")
    if rl_prompt_tokens is not None:
        if max_prompt_tokens is None or rl_prompt_tokens <= max_prompt_tokens:
            raise InputError(f"rl_prompt_tokens={rl_prompt_tokens} keeps the rows longer than max_prompt_tokens for RL alone: give "
                             f"max_prompt_tokens (now {max_prompt_tokens}) and an rl_prompt_tokens above it")
        if no_call_share is not None:
            raise InputError(f"rl_prompt_tokens={rl_prompt_tokens} with no_call_share={no_call_share}: the RL-only rows would change "
                             "the share's draw; leave no_call_share out and set the no-call rows' share of a batch with "
                             "data.sampler.shares (as bfcl_grpo does)")


def _prompt_length(question: Question, tokenizer: Any) -> int:
    """The question's prompt length in tokens, rendered with its functions as posttrain renders it."""
    return len(tokenize_prompts([question.messages], tokenizer, tool_schemas(question.functions))[0])


def _drop_long(questions: dict[str, list[Question]], max_prompt_tokens: int | None, tokenizer_name: str, report: Report,
               rl_prompt_tokens: int | None = None) -> tuple[list[Question], list[Question]]:
    """(the training questions whose prompt fits ``max_prompt_tokens`` (all where None), those longer but within
    ``rl_prompt_tokens``: RL's alone); counts go into ``report``."""
    if max_prompt_tokens is None:
        return questions["train"], []
    tokenizer = load_tokenizer(tokenizer_name)
    lengths = {split: [_prompt_length(q, tokenizer) for q in items] for split, items in questions.items()}
    train = list(zip(questions["train"], lengths["train"]))
    outer = rl_prompt_tokens or max_prompt_tokens
    report.max_prompt_tokens, report.rl_prompt_tokens = max_prompt_tokens, rl_prompt_tokens
    rl_only = [q for q, n in train if max_prompt_tokens < n <= outer]
    report.dropped = Counter(q.category for q, n in train if n > outer)
    report.rl_only = Counter(q.category for q in rl_only)
    report.test_over = sum(n > max_prompt_tokens for n in lengths["test"])
    report.longest = {split: max(values, default=0) for split, values in lengths.items()}
    return [q for q, n in train if n <= max_prompt_tokens], rl_only


def _cap_no_call(questions: list[Question], share: float, seed: int, report: Report) -> list[Question]:
    """At most ``share`` of the training rows from categories whose answer is no call (live_irrelevance):
    a seeded draw of them is kept, the others dropped (counted in ``report.cut``), the order kept."""
    no_call = [i for i, q in enumerate(questions) if bfcl.is_no_call_category(q.category)]
    others = len(questions) - len(no_call)
    keep = min(len(no_call), int(share * others / (1 - share)) if share < 1 else len(no_call))
    kept = set(random.Random(seed).sample(no_call, keep))
    report.cut = Counter(questions[i].category for i in no_call if i not in kept)
    report.no_call_share = share
    return [q for i, q in enumerate(questions) if i in kept or not bfcl.is_no_call_category(q.category)]


def _near_misses(train: list[Question], categories: list[str]) -> list[Question]:
    """``near_irrelevance``: the live_irrelevance questions that share a subject word with their functions
    (:func:`bfcl.shared_subject_words`) take the category :data:`NEAR_CATEGORY`, which is
    added to ``categories``; the others and their order stay."""
    categories.append(NEAR_CATEGORY)
    return [replace(q, category=NEAR_CATEGORY) if q.category == NEAR_FROM and bfcl.shared_subject_words(q.messages, q.functions)
            else q for q in train]


def _joined(train: list[Question], report: Report) -> list[Question]:
    """``joined_values``: the questions :func:`~posttrain.data.preparers.bfcl_added.joins_values` finds take their category
    with :data:`~posttrain.data.preparers.bfcl_added.JOINED_SUFFIX` (counted in ``report``); the rest stays. Done after
    the added rows are drawn, so that they are the same with it or without."""
    joined = [replace(q, category=q.category + added_rows.JOINED_SUFFIX) if added_rows.joins_values(q) else q for q in train]
    report.joined = Counter(q.category for q in joined if q.category.endswith(added_rows.JOINED_SUFFIX))
    return joined


def _write_multi_turn(questions: list[dict[str, Any]], out_dir: Path, report: Report) -> list[Path]:
    report.multi_turn = Counter(q["category"] for q in questions)
    return [write_rows([multi_turn_row(q, i) for i, q in enumerate(questions)], out_dir / "test_multi_turn.parquet")] if questions else []


def _row(question: Question, split: str, index: int, written: dict[str, Any], held: set[str], rl_only: bool = False) -> dict[str, Any]:
    extra_info = {"split": split, "index": index, "id": question.id, "category": question.category,
                  IN_SFT: question.id in written and question.id not in held, RL_ONLY: rl_only,
                  "tools": json.dumps(tool_schemas(question.functions), ensure_ascii=False),
                  "bfcl_functions": json.dumps(question.functions, ensure_ascii=False)}
    if question.id in written:  # its SFT transcript's answer, for algorithm.guidance (rollout/guidance.py)
        extra_info[REFERENCE_ANSWER] = written[question.id][-1]["content"]
    return make_row(data_source=DATA_SOURCE, messages=question.messages, ground_truth=json.dumps(question.ground_truth, ensure_ascii=False),
                    ability=ABILITY, extra_info=extra_info)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise InputError(f"{path} is missing from the installed bfcl-eval; reinstall it: {bfcl.INSTALL_HINT}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
