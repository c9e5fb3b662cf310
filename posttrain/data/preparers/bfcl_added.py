"""The rows ``posttrain prepare bfcl``'s options make from BFCL's own training questions (docs in
:mod:`posttrain.data.preparers.bfcl`): ``parallel_pairs``, ``union_pairs`` and ``dev_pairs`` (two or more questions asked
at once), ``swapped_irrelevance`` (a question asked with another question's functions, about something else), ``masked_irrelevance`` (a
question asked with its own functions less the ones its answer calls) and ``distractors`` / ``dev_distractors`` (a question
asked with its own function among others' functions) and ``multi_value`` (a question asked for several values of one
argument at once) and ``outside_irrelevance`` / ``dev_outside`` (a word problem from outside BFCL asked with a
question's functions). Each is a seeded draw; ``too_long(row)``
says which rows the prompt cap leaves out."""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import replace
from typing import Any, Callable, Protocol, TypeVar

from posttrain.data.preparers import gsm8k
from posttrain.rewards.bfcl import ast_checker, bfcl_module, name_words, question_words, subject_words


class Asked(Protocol):
    """What these functions read of a question (:class:`posttrain.data.preparers.bfcl.Question`, a dataclass: the
    rows they make are copies of it with :func:`dataclasses.replace`)."""

    id: str
    category: str
    messages: list[dict[str, str]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, Any]]


Question = TypeVar("Question", bound=Asked)

# parallel_pairs: two questions of this training category asked together make a row of this category, judged by
# BFCL's parallel rule (the checker picks it by "parallel" in the name); no BFCL category of its own
PAIRED_CATEGORY, PAIRS_CATEGORY = "live_simple", "synthetic_parallel"
# union_pairs, dev_pairs: two questions with different functions asked together, with both questions' functions (BFCL's parallel rule)
UNION_PAIRS_CATEGORY = "synthetic_parallel_multiple"
# swapped_irrelevance: questions of these categories asked with another question's functions
SWAPPED_FROM, SWAPPED_CATEGORY = ("live_simple", "live_multiple"), "swapped_irrelevance"
# masked_irrelevance: questions of this category (several functions each) asked without the functions they need
MASKED_FROM, MASKED_CATEGORY = "live_multiple", "masked_irrelevance"

# multi_value: questions of these categories (one call) asked for several values of one argument, answered by one call per
# value (BFCL's parallel rule: "parallel" in the name); values_from chooses among them, the first alone by default
VALUES_FROM, VALUES_CATEGORY = ("live_simple", "live_multiple"), "synthetic_parallel_values"

# joined_values: one-call training questions whose text joins values of two different arguments with "and" take their
# category with this suffix (the shape multi_value's rows list one argument's values in, answered by one call)
JOINED_SUFFIX, _JOIN_GAP = "_joined", 40

# distractors: questions of this category (one function, one call) asked with their function among others', answered by their call
DISTRACTED_FROM, DISTRACTED_CATEGORY = "live_simple", "synthetic_multiple"

# outside_irrelevance: word problems from outside BFCL (GSM8K, shipped with posttrain), a kind of question no BFCL training
# category asks, each asked with a taught question's functions about something else
OUTSIDE_CATEGORY = "outside_irrelevance"
# how the words of functions that could do a step of a word problem's arithmetic begin (any word of their names and
# descriptions, whatever its length or form: "Calculates", Spanish "Calcula", "sum_numbers"): none such is offered with one
_ARITHMETIC_STARTS = ("calcul", "comput", "arithmet", "math", "multiply", "multipli", "divid", "division", "subtract", "percent",
                      "equation", "formula")
_ARITHMETIC_WORDS = frozenset({"sum", "sums"})  # whole words: not "summary"

# the options that add training rows (with their SFT transcripts), and each added-rows option's report line
TRAIN_OPTIONS = ("parallel_pairs", "union_pairs", "swapped_irrelevance", "masked_irrelevance", "distractors", "multi_value",
                 "outside_irrelevance")
REPORT_LINES = {
    "parallel_pairs": (f"{PAIRS_CATEGORY} rows", f", two (to most_calls) {PAIRED_CATEGORY} questions with the "
                       "same functions asked together, in train and SFT"),
    "union_pairs": (f"{UNION_PAIRS_CATEGORY} rows", ", two (to most_calls) taught questions asked together with all "
                    "their functions, in train and SFT"),
    "swapped_irrelevance": (f"{SWAPPED_CATEGORY} rows", f", a taught {' or '.join(SWAPPED_FROM)} question "
                            "asked with another's functions, in train and SFT"),
    "dev_swapped": ("dev_swapped.parquet", f" {SWAPPED_CATEGORY} rows, an SFT validation question asked with "
                    "another's functions, for evaluation only"),
    "masked_irrelevance": (f"{MASKED_CATEGORY} rows", f", a taught {MASKED_FROM} question asked without the "
                           "functions its answer calls, in train and SFT"),
    "dev_masked": ("dev_masked.parquet", f" {MASKED_CATEGORY} rows, an SFT validation question asked without the "
                   "functions its answer calls, for evaluation only"),
    "dev_pairs": ("dev_pairs.parquet", f" {UNION_PAIRS_CATEGORY} rows, two (to dev_most_calls) SFT validation "
                  "questions asked together with both questions' functions, for evaluation only"),
    "distractors": (f"{DISTRACTED_CATEGORY} rows", f", a taught {DISTRACTED_FROM} question asked with its function "
                    "among 1 to 3 others', in train and SFT"),
    "multi_value": (f"{VALUES_CATEGORY} rows", ", a taught question of values_from asked for 2 (to most_calls) values of "
                    "one argument, in train and SFT"),
    "dev_values": ("dev_values.parquet", f" {VALUES_CATEGORY} rows, an SFT validation question asked for 2 (to "
                   "dev_most_calls) values of one argument, for evaluation only"),
    "dev_distractors": ("dev_distractors.parquet", f" {DISTRACTED_CATEGORY} rows, an SFT validation question asked "
                        "with its function among 1 to 3 others', for evaluation only"),
    "outside_irrelevance": (f"{OUTSIDE_CATEGORY} rows", ", a GSM8K train word problem asked with a taught question's "
                            "functions, in train and SFT"),
    "dev_outside": ("dev_outside.parquet", f" {OUTSIDE_CATEGORY} rows, a GSM8K test word problem asked with an SFT "
                    "validation question's functions, for evaluation only"),
}

# verbs that start many functions' names: two names sharing only one of them do not do the same thing
_NAME_VERBS = frozenset("get set list create update delete find search add remove fetch check send make show".split())

TooLong = Callable[[Any], bool]


def _single_user_turn(question: Question) -> bool:
    return [m["role"] for m in question.messages] == ["user"]


def _drawn(candidates: list[Any], count: int, rng: random.Random, make: Callable[[Any], Question | None]) -> list[Question]:
    """The first ``count`` rows ``make`` gives (None: that candidate skipped), the candidates tried in the order ``rng``
    shuffles them into (in place): the seeded draw every added-rows option makes."""
    rng.shuffle(candidates)
    rows: list[Question] = []
    for candidate in candidates:
        if len(rows) == count:
            break
        if (row := make(candidate)) is not None:
            rows.append(row)
    return rows


def parallel_pairs(questions: list[Question], taught: set[str], count: int, seed: int, left_out: TooLong, *,
                   same_functions: bool = True, both_bring_functions: bool = False, most_calls: int = 2) -> list[Question]:
    """Up to ``count`` two-call questions, each two taught (ids in ``taught``) single-call questions of
    :data:`PAIRED_CATEGORY` with the same functions (a seeded draw of distinct pairs), asked in one user message;
    their answer is both possible answers, judged by BFCL's parallel rule (category :data:`PAIRS_CATEGORY`).
    ``left_out`` says which pairs are not kept (over the prompt cap, or with no SFT transcript).
    With ``same_functions`` false (``union_pairs``; ``dev_pairs``: the few questions SFT holds back seldom share their functions) any
    two such questions of :data:`SWAPPED_FROM` with distinct answers pair, asked with both questions' functions (each
    name once; a pair whose one name has two docs is skipped), in category :data:`UNION_PAIRS_CATEGORY`, as BFCL's
    parallel_multiple rows are: several functions, several calls. With ``both_bring_functions`` (``union_pairs``) a pair
    whose later questions bring no function of their own is skipped: it would be a ``parallel_pairs`` row under another
    category (the same id, in the same training file). With ``most_calls`` above 2 each pair asks 2 to ``most_calls``
    questions (a seeded even draw of the number; the questions past the pair drawn from those that could pair with it; a
    row over the cap asks one fewer, down to the pair): BFCL's parallel rows ask for 2 to 4 calls. At 2 the draw is the one it always was."""
    if count == 0:
        return []
    kinds = (PAIRED_CATEGORY,) if same_functions else SWAPPED_FROM
    alike: dict[str, list[Question]] = {}
    for q in questions:
        if q.category in kinds and q.id in taught and len(q.ground_truth) == 1 and _single_user_turn(q):
            alike.setdefault(_alike_key(q, same_functions), []).append(q)
    candidates = [(a, b) for group in alike.values() for i, a in enumerate(group) for b in group[i + 1:] if a.ground_truth != b.ground_truth]
    sizes = random.Random(f"{seed} most_calls")

    def pair(a: Question, b: Question) -> Question | None:
        asked = [a, b] if most_calls == 2 else _more(a, b, alike[_alike_key(a, same_functions)], sizes.randint(2, most_calls), sizes)
        # a row over the cap asks one question fewer, down to the pair
        rows = (_together(asked[:n], same_functions, both_bring_functions) for n in range(len(asked), 1, -1))
        return next((row for row in rows if row is not None and not left_out(row)), None)

    return _drawn(candidates, count, random.Random(seed), lambda candidate: pair(*candidate))


def _together(asked: list[Question], same_functions: bool, both_bring_functions: bool) -> Question | None:
    """``asked`` in one user message, answered by all their calls (:func:`parallel_pairs`); None when their functions
    clash or, with ``both_bring_functions``, the later questions bring none of their own."""
    first = asked[0]
    functions = first.functions if same_functions else _union(*(q.functions for q in asked))
    if functions is None or (both_bring_functions and len(functions) == len(first.functions)):
        return None
    return replace(first, id="pair_" + "+".join(q.id for q in asked), category=PAIRS_CATEGORY if same_functions else UNION_PAIRS_CATEGORY,
                   functions=functions, ground_truth=[call for q in asked for call in q.ground_truth],
                   messages=[{"role": "user", "content": "\n\n".join(q.messages[0]["content"] for q in asked)}])


def _alike_key(question: Question, same_functions: bool) -> str:
    return json.dumps(question.functions, sort_keys=True) if same_functions else ""


def _more(a: Question, b: Question, group: list[Question], size: int, rng: random.Random) -> list[Question]:
    """``a``, ``b`` and up to ``size`` - 2 more of ``group`` (a seeded draw), each with an answer of its own."""
    asked = [a, b]
    for q in rng.sample(group, len(group)):
        if len(asked) == size:
            break
        if all(q.id != other.id and q.ground_truth != other.ground_truth for other in asked):
            asked.append(q)
    return asked


def _union(*functions: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Each list's functions not named in an earlier one, in order; None when a name has two different docs."""
    named: dict[str, dict[str, Any]] = {}
    for doc in (doc for docs in functions for doc in docs):
        if named.setdefault(doc["name"], doc) != doc:
            return None
    return list(named.values())


def swapped(pool: list[Question], count: int, seed: int, too_long: TooLong) -> list[Question]:
    """Up to ``count`` irrelevance rows of category :data:`SWAPPED_CATEGORY` from ``pool`` (questions with calls): a
    question of :data:`SWAPPED_FROM` asked with the functions of another question of ``pool`` (a seeded draw) that
    share no subject word (:func:`~posttrain.rewards.bfcl.subject_words`) with its own functions or the longer words of its question."""
    if count == 0:
        return []
    asked = [q for q in pool if q.category in SWAPPED_FROM and _single_user_turn(q)]
    rng = random.Random(seed)

    def swap(question: Question) -> Question | None:
        own = subject_words(question.functions) | question_words(question.messages[0]["content"])
        donors = [d for d in pool if d.id != question.id and not own & subject_words(d.functions)]
        if not donors:
            return None
        donor = rng.choice(donors)
        row = replace(question, id=f"swap_{question.id}+{donor.id}", category=SWAPPED_CATEGORY, functions=donor.functions, ground_truth=[])
        return None if too_long(row) else row

    return _drawn(asked, count, rng, swap)


def outside(split: str, pool: list[Question], count: int, seed: int, too_long: TooLong) -> list[Question]:
    """Up to ``count`` irrelevance rows of category :data:`OUTSIDE_CATEGORY`: a GSM8K word problem of ``split`` (the
    copy vendored in posttrain; a seeded draw, each asked once) asked with the functions of a question of ``pool``
    (questions with calls; a seeded draw) that share no subject word (:func:`~posttrain.rewards.bfcl.subject_words`) with
    the problem's longer words and do no arithmetic (:func:`does_arithmetic`: a calculator could do a step of the problem).
    The rows' ids name both: ``outside_gsm8k-train-12+live_simple_3-2-1`` is problem 12 asked with that question's functions."""
    if count == 0:
        return []
    problems = [problem["question"] for problem in gsm8k.vendored(split)]
    donors = [(d, subject_words(d.functions)) for d in pool if not does_arithmetic(d.functions)]
    rng = random.Random(f"{seed} outside")

    def ask(numbered: tuple[int, str]) -> Question | None:
        index, problem = numbered
        own = question_words(problem)
        fitting = [d for d, words in donors if not own & words]
        if not fitting:
            return None
        donor = rng.choice(fitting)
        row = replace(donor, id=f"outside_gsm8k-{split}-{index}+{donor.id}", category=OUTSIDE_CATEGORY,
                      messages=[{"role": "user", "content": problem}], ground_truth=[])
        return None if too_long(row) else row

    return _drawn(list(enumerate(problems)), count, rng, ask)


def does_arithmetic(functions: list[dict[str, Any]]) -> bool:
    """Whether a word of the functions' names or descriptions begins as :data:`_ARITHMETIC_STARTS` or is one of
    :data:`_ARITHMETIC_WORDS`: ``get_area_of_square``, "Calculates the area of a square", does."""
    words = set()
    for doc in functions:
        words |= name_words(doc["name"]) | set(re.findall(r"[a-z]+", str(doc.get("description", "")).lower()))
    return any(word in _ARITHMETIC_WORDS or word.startswith(_ARITHMETIC_STARTS) for word in words)


def _stem_words(name: str) -> set[str]:
    """A name's words without trailing digits and without :data:`_NAME_VERBS` (wherever they stand): ``uber.ride2`` →
    {uber, ride}."""
    return {w.rstrip("0123456789") for w in name_words(name)} - _NAME_VERBS - {""}


def masked(pool: list[Question], count: int, seed: int, too_long: TooLong) -> list[Question]:
    """Up to ``count`` irrelevance rows of category :data:`MASKED_CATEGORY` from ``pool`` (questions with calls): a
    question of :data:`MASKED_FROM` asked with its own functions less those its possible answer calls and less any
    whose name shares a word with theirs (:func:`_stem_words`: ``uber.ride2`` goes with ``uber.ride``, and a
    ``Service_N_Action`` name takes its whole service with it); a question with none left is skipped. The label is no call, as the masked function was the one the question needs; a kept
    function that could do it under another name would make a wrong label (left to the name rule)."""
    if count == 0:
        return []
    asked = [q for q in pool if q.category == MASKED_FROM and _single_user_turn(q)]

    def mask(question: Question) -> Question | None:
        needed = {name for call in question.ground_truth for name in call}
        needed_words = set().union(*(_stem_words(name) for name in needed))
        rest = [f for f in question.functions if f["name"] not in needed and not _stem_words(f["name"]) & needed_words]
        row = replace(question, id=f"mask_{question.id}", category=MASKED_CATEGORY, functions=rest, ground_truth=[])
        return None if not rest or too_long(row) else row

    return _drawn(asked, count, random.Random(seed), mask)


def distractors(asked: list[Question], donors: list[Question], count: int, seed: int, too_long: TooLong, *,
                most_functions: int = 4) -> list[Question]:
    """Up to ``count`` rows of category :data:`DISTRACTED_CATEGORY` (BFCL's multiple rule: one call, of the right one
    of several functions): a question of ``asked`` of :data:`DISTRACTED_FROM` (one function, one call, one user
    message) asked with its function and 1 to ``most_functions`` - 1 functions of other questions of ``donors`` (a
    seeded even draw of the number, the order shuffled), its answer its own call, as BFCL's held-out ``multiple``
    rows are. Near functions first: those sharing a subject word (:func:`~posttrain.rewards.bfcl.subject_words`) with
    its own, as a ``multiple`` row offers functions of one subject; never one of the same name, one whose name shares
    a word with its own function's name (:func:`_stem_words`: ``get_weather`` beside ``get_current_weather`` could do
    the job) or with a word of three letters or more of its question, nor one whose subject words include the question's longer words
    (``weather.get_weather_data``, "including temperature", for "the current temperature in Paris"). A row over the cap
    offers one function fewer (the last drawn), down to two; a question with no function left to add is skipped. A
    distractor that could do the job in other words makes a wrong label (left to these word rules)."""
    if count == 0:
        return []
    offered: dict[str, dict[str, Any]] = {}
    for doc in (doc for q in donors for doc in q.functions):
        offered.setdefault(doc["name"], doc)
    subjects = {name: subject_words([doc]) for name, doc in offered.items()}
    stems = {name: _stem_words(name) or name_words(name) for name in offered}  # a name of verbs alone ("add") is its words
    candidates = [q for q in asked if q.category == DISTRACTED_FROM and len(q.functions) == 1 and len(q.ground_truth) == 1
                  and _single_user_turn(q)]
    rng = random.Random(seed)

    def distract(question: Question) -> Question | None:
        own, text = question.functions[0], question.messages[0]["content"]
        own_subjects, spoken = subject_words([own]), question_words(text)
        unlike = (_stem_words(own["name"]) or name_words(own["name"])) | {w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)}
        allowed = [name for name in offered if name != own["name"] and not stems[name] & unlike and not subjects[name] & spoken]
        if not allowed:
            return None
        size = rng.randint(1, most_functions - 1)
        near = [name for name in allowed if subjects[name] & own_subjects]
        chosen = rng.sample(near, min(size, len(near)))
        far = [name for name in allowed if not subjects[name] & own_subjects]
        chosen += rng.sample(far, min(size - len(chosen), len(far)))
        functions = [own] + [offered[name] for name in chosen]
        rng.shuffle(functions)
        rows = (replace(question, id=f"distract_{question.id}", category=DISTRACTED_CATEGORY,
                        functions=[f for f in functions if f is own or f["name"] in chosen[:n - 1]]) for n in range(len(functions), 1, -1))
        return next((row for row in rows if not too_long(row)), None)

    return _drawn(candidates, count, rng, distract)


def multi_value(asked: list[Question], donors: list[Question], count: int, seed: int, too_long: TooLong, *,
                most_calls: int = 4, kinds: tuple[str, ...] = VALUES_FROM[:1]) -> list[Question]:
    """Up to ``count`` rows of category :data:`VALUES_CATEGORY` (BFCL's parallel rule), as BFCL's held-out ``parallel``
    rows are (one function called for several values: "the weather in Boston and Paris"): a question of ``asked`` of
    ``kinds`` (of :data:`VALUES_FROM`; one call, one user message; a live_multiple question keeps all its functions)
    with an argument whose value its question writes once, word for word, and no other argument holds (a string of 3
    characters or more without " and ", or a number), asked for 2 to ``most_calls`` values of it (a seeded even draw of the number
    wanted; fewer where fewer other values exist): the value in the question becomes the list of values ("Boston, MA;
    Paris, France and Rome, Italy", each in the quotes the value stood in), the answer one call per value, each call
    otherwise the question's possible answer. The other values are those ``donors``' possible answers give the same
    function's same parameter, or the parameter's ``enum`` (only enum values where it has one); for a number with too
    few of them, nearby numbers of its type and sign; none that BFCL's checker reads as one already listed (its
    ``standardize_string``: "Austin, TX" and "austin tx") or as one of the question's own accepted values. A value
    inside a longer quoted phrase, in a list of numbers ("2,3,4") or a time ("2:30") is not listed. One row per
    question at most (a question with no such argument, or too few other values, is skipped); a row over the cap asks
    for one value fewer, down to two."""
    if count == 0:
        return []
    seen: dict[tuple[str, str], list[Any]] = {}
    given = ((name, param, values[0]) for q in donors for call in q.ground_truth for name, args in call.items()
             for param, values in args.items() if values and _plain(values[0]))
    for name, param, value in given:
        if value not in seen.setdefault((name, param), []):
            seen[(name, param)].append(value)
    candidates = [q for q in asked if q.category in kinds and len(q.ground_truth) == 1 and _single_user_turn(q)]
    rng = random.Random(seed)

    def ask_values(question: Question) -> Question | None:  # the first argument that can be listed, or None
        (name, args), = question.ground_truth[0].items()
        text = question.messages[0]["content"]
        size = rng.randint(2, most_calls)
        for param, values in args.items():
            value = values[0] if values else None
            span = _written_once(value, text) if _plain(value) else None
            if span is None or _held_elsewhere(value, {p: v for p, v in args.items() if p != param}):
                continue
            enum = _enum(question.functions, name, param)
            offered = [v for v in seen.get((name, param), []) + enum if not enum or v in enum]
            others = _other_values(value, values, offered, size - 1, rng)
            if others:
                return _values_row(question, name, args, param, [value, *others], text, span, too_long)
        return None

    return _drawn(candidates, count, rng, ask_values)


def joins_values(question: Asked) -> bool:
    """Whether ``question`` (one user message, one call) writes values of two different arguments of its call (for each
    argument the first of its accepted values the text writes once, in any case) with "and" between them and at most
    :data:`_JOIN_GAP` characters, no sentence end (".?!;"), between ("a base of 10 units and height of 5 units", "a human
    and a chimp"): said as a ``multi_value`` row lists one argument's values, answered by one call. An "and" joining two
    clauses between two values ("..., CA, USA, and I can wait up to 600 seconds") counts too."""
    if not _single_user_turn(question) or len(question.ground_truth) != 1:
        return False
    text = question.messages[-1]["content"].lower()
    (args,) = question.ground_truth[0].values()

    def written(values: list[Any]) -> tuple[int, int, str] | None:  # the first of the values the text writes once
        lowered = (v.lower() if isinstance(v, str) else v for v in values if _plain(v))
        return next((span for v in lowered if (span := _written_once(v, text)) is not None), None)

    spans = sorted(span[:2] for values in args.values() if (span := written(values)) is not None)
    gaps = (text[end:start] for (_, end), (start, _) in zip(spans, spans[1:]))
    return any(len(gap) <= _JOIN_GAP and re.search(r"\band\b", gap) and not re.search(r"[.?!;]", gap) for gap in gaps)


def _plain(value: Any) -> bool:
    """A value a question can write as it is and list: a string of 3 characters or more without " and " (a list of them
    would not say where one ends), or a number (not a bool)."""
    return (isinstance(value, str) and len(value.strip()) >= 3 and " and " not in value) or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _spoken(value: Any) -> str:
    """How a question writes ``value``: a whole float as an int (``5.0`` → ``5``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@functools.cache
def _standardize() -> Callable[[str], str]:
    """BFCL's checker's ``standardize_string``, its module imported as :func:`~posttrain.rewards.bfcl.ast_checker` does."""
    ast_checker()
    return bfcl_module("bfcl_eval.eval_checker.ast_eval.ast_checker").standardize_string


def _same(a: Any, b: Any) -> bool:
    """Whether BFCL's checker reads ``a`` and ``b`` as one value: strings through its ``standardize_string``, numbers by value."""
    if isinstance(a, str) and isinstance(b, str):
        return _standardize()(a) == _standardize()(b)
    return not isinstance(a, str) and not isinstance(b, str) and a == b


def _held_elsewhere(value: Any, others: dict[str, list[Any]]) -> bool:
    """Whether another argument's accepted value is ``value`` or holds it as text (an end date equal to the start date,
    a URL with the name in it): listing it would change one argument and leave the other."""
    spoken = _spoken(value).lower()
    return any(_same(v, value) or spoken in _spoken(v).lower() for values in others.values() for v in values if _plain(v))


_QUOTES = "'\"`"


def _written_once(value: Any, text: str) -> tuple[int, int, str] | None:
    """Where ``text`` writes ``value`` (start, end, the quote around it or ""), when it writes it exactly once as a whole
    word (a number not inside a longer number, a list of numbers or a time) and not inside a longer quoted phrase; else None."""
    spoken = re.escape(_spoken(value))
    pattern = (rf"(?<![\w.`]){spoken}(?!\w)" if isinstance(value, str)
               else rf"(?<![\w.\-,:]){spoken}(?![\w]|[.,:]\d)")
    found = list(re.finditer(pattern, text))
    if len(found) != 1:
        return None
    start, end = found[0].span()
    if 0 < start and end < len(text) and text[start - 1] == text[end] and text[end] in _QUOTES:
        return (start - 1, end + 1, text[end])
    quoted = (m.span(2) for m in re.finditer(rf"(?<!\w)([{_QUOTES}])(.+?)\1(?!\w)", text))
    if any(a <= start and end <= b for a, b in quoted):  # a word of a longer quoted phrase
        return None
    return (start, end, "")


def _enum(functions: list[dict[str, Any]], name: str, param: str) -> list[Any]:
    doc = next((f for f in functions if f["name"] == name), {})
    return list(doc.get("parameters", {}).get("properties", {}).get(param, {}).get("enum", []))


def _other_values(value: Any, accepted: list[Any], offered: list[Any], wanted: int, rng: random.Random) -> list[Any]:
    """Up to ``wanted`` values of ``value``'s type that BFCL's checker reads as none of ``accepted`` (the question's own
    accepted values) nor as one another: drawn from ``offered``, then, for a number, nearby numbers (within half its size,
    at least 3, of it, of its sign; a float rounded to as many decimals)."""
    kind = str if isinstance(value, str) else (int, float)
    others: list[Any] = []

    def fresh(v: Any) -> bool:  # ``accepted`` holds ``value`` itself
        return not any(_same(v, taken) for taken in [*accepted, *others])

    pool = [v for v in dict.fromkeys(offered) if isinstance(v, kind) and not isinstance(v, bool) and (not isinstance(v, str) or _plain(v))]
    for v in rng.sample(pool, len(pool)):
        if len(others) < wanted and fresh(v):
            others.append(v)
    if isinstance(value, str):
        return others
    places, reach = len(_spoken(value).partition(".")[2]), max(3, abs(value) / 2)
    for _ in range(100):
        if len(others) == wanted:
            break
        near = rng.uniform(value - reach, value + reach)
        near = round(near, places) if places else (float(round(near)) if isinstance(value, float) else round(near))
        if near != 0 and (near > 0) == (value > 0 or value == 0) and fresh(near):
            others.append(near)
    return others


def _listed(values: list[Any], quote: str) -> str:
    """``values`` as a question lists them: "a, b and c" ("; " between values that hold a comma), each in ``quote``."""
    words = [f"{quote}{_spoken(v)}{quote}" for v in values]
    between = "; " if any("," in w for w in words) else ", "
    return between.join(words[:-1]) + " and " + words[-1]


def _values_row(question: Question, name: str, args: dict[str, Any], param: str, values: list[Any], text: str,
                span: tuple[int, int, str], too_long: TooLong) -> Question | None:
    """``question`` asked for ``values`` of ``param`` (the first its own), one call each; the longest of the first 2 to all
    ``values`` under the cap, or None."""
    start, end, quote = span
    for n in range(len(values), 1, -1):
        asked = text[:start] + _listed(values[:n], quote) + text[end:]
        row = replace(question, id=f"values_{question.id}", category=VALUES_CATEGORY,
                      messages=[{"role": "user", "content": asked}],
                      ground_truth=[{name: {**args, param: [v] if i else args[param]}} for i, v in enumerate(values[:n])])
        if not too_long(row):
            return row
    return None
