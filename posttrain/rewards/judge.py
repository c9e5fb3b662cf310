"""An LLM judge as a rubric part (``reward.rubric: [{name, weight, judge: {...}}]``, rewards/rubric.py).

A judge part asks the run's environment model (``env.llm``: the Env-LLM worker, or any OpenAI-compatible
server at ``env.llm.url``, through the same client the environments use, agents/env_llm.py) one question
per answer and reads a number out of its reply::

    - name: same_condition
      weight: 1.0
      judge:
        prompt: 'A doctor diagnosed: "{answer}". The correct diagnosis is: "{ground_truth}". Do they name the same condition? Answer only yes or no.'
        parser: yes_no        # yes_no (yes 1, no 0) | score (the first number ÷ scale, in [0, 1]) | choice (the first label ↦ its value)
        rule: synthetic_doctor  # optional: where it says yes the judge is not asked; the agreement check's reference

- **The prompt** is a ``str.format`` template over ``{answer}`` (the reply scored), ``{ground_truth}`` (the gold
  answers, ``" / "``-joined), ``{question}`` (the row's last user message), ``{data_source}`` and
  ``{extra_info[KEY]}``; it becomes one user message.
- **Parsers** (:data:`PARSERS`): ``yes_no`` reads the reply's first word; ``score`` its first number divided by
  ``scale`` (e.g. 10 for "0 to 10"), refused outside [0, 1]; ``choice`` the first of ``choices``' labels that
  stands as a word (``{A: 1.0, B: 0.5, C: 0}``). A reply none of them reads is *unparsable*: it scores
  ``unparsable`` (0 by default) and is counted (``reward/<name>/unparsable``).
- **The rule** (optional, a data source or ``FILE.py:FUNCTION``, as a rule part's): an answer it accepts (score
  >= 1 or its ``acc``) scores 1 without asking the judge (the doctor's "exact name, else ask the model"), and it
  is the reference of the check before training (:func:`agreement`).
- **Asking** (:func:`ask`): every answer of one scoring call in one batched request, under one deadline
  (``reward.judge.timeout_s``); a reply that fails or comes too late scores 0 for that part and is counted
  (``reward/<name>/errors``; ``judge/failures`` of ``judge/replies`` trips the ``judge`` circuit breaker,
  trainer/breakers.py, so a judge that stops answering stops the run, which a restart resumes).
- **The cache**: replies are stored by (the judge model and its files, the sampling settings, the rendered prompt,
  which holds the ground truth), in ``reward.judge.cache`` (default: ``judge_cache.sqlite`` in the run's directory),
  so a resumed run, or an evaluation run again, never asks twice.
"""

from __future__ import annotations

import math
import numbers
import re
import string
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posttrain.errors import InputError, PosttrainError
from posttrain.rewards.search_answer import gold_answers

# The client is posttrain.agents.env_llm's EnvLLM (``chat(conversations) -> replies``, each with ``text`` and
# ``failed``), duck-typed: rewards/ stands below agents/, and the scoring process imports this module with
# the rubric, where no HTTP client is needed.
EnvLLM = Any
Messages = Sequence[Mapping[str, Any]]

PARSERS = ("yes_no", "score", "choice")
FIELDS = ("answer", "ground_truth", "question", "data_source", "extra_info")
_YES_NO = re.compile(r"\W*(yes|no)\b", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeDisagrees(PosttrainError):
    """Before training, the judge agreed with its rule on too few answers (:func:`agreement`)."""

    exit_code = 2


@dataclass(frozen=True)
class JudgeQuestion:
    """What a judge part asks and how it reads the reply (module docstring). Picklable: it travels
    with the rubric to the scoring process, which runs its ``rule``."""

    prompt: str
    parser: str = "yes_no"
    choices: tuple[tuple[str, float], ...] = ()
    scale: float = 1.0
    unparsable: float = 0.0
    rule: Callable[..., Any] | None = None

    @property
    def verdict(self) -> bool:
        """Whether the reply is a yes/no verdict (then it is also the part's ``acc``)."""
        return self.parser == "yes_no"

    def messages(self, answer: str, ground_truth: Any, prompt: Sequence[Mapping[str, Any]] | None = None,
                 data_source: str | None = None, extra_info: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
        """The judge's conversation for one answer; KeyError where the template names a missing extra_info key."""
        fields = {"answer": answer, "ground_truth": gold_text(ground_truth), "question": last_user_text(prompt),
                  "data_source": data_source or "", "extra_info": dict(extra_info or {})}
        return [{"role": "user", "content": self.prompt.format_map(fields)}]

    def read(self, reply: str) -> float | None:
        """The reply as a number in [0, 1], or None when the parser cannot read it."""
        if self.parser == "yes_no":
            found = _YES_NO.match(reply)
            return None if found is None else float(found.group(1).lower() == "yes")
        if self.parser == "score":
            found = _NUMBER.search(reply)
            value = None if found is None else float(found.group()) / self.scale
            return value if value is not None and 0.0 <= value <= 1.0 else None
        labels = "|".join(re.escape(label) for label, _ in self.choices)
        found = re.search(rf"(?<!\w)({labels})(?!\w)", reply)
        return None if found is None else dict(self.choices)[found.group(1)]


def build_question(spec: Any, where: str, rule_function: Callable[[str, str], Callable[..., Any]]) -> JudgeQuestion:
    """A judge part's question from its ``judge:`` mapping; an InputError naming ``where`` for a missing or
    malformed prompt, an unknown parser, choices or scale that cannot work, an unknown key."""
    if not isinstance(spec, Mapping):
        raise InputError(f"{where}: judge must be a mapping {{prompt, parser, ...}}, not {spec!r}")
    spec = dict(spec)
    prompt, parser = spec.pop("prompt", None), spec.pop("parser", "yes_no")
    choices, scale, unparsable, rule = spec.pop("choices", None), spec.pop("scale", 1.0), spec.pop("unparsable", 0.0), spec.pop("rule", None)
    if spec:
        raise InputError(f"{where}: unknown judge keys {sorted(spec)}; a judge has prompt, parser, choices, scale, unparsable, rule")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f"{where}: give the judge a prompt, a template over {{answer}} and {{ground_truth}} (module rewards/judge.py)")
    _check_template(prompt, where)
    if parser not in PARSERS:
        raise InputError(f"{where}: parser={parser!r} must be one of {PARSERS}")
    pairs: tuple[tuple[str, float], ...] = ()
    if parser == "choice":
        if not isinstance(choices, Mapping) or not choices:
            raise InputError(f"{where}: parser=choice needs choices, labels to values, e.g. {{A: 1.0, B: 0.0}}")
        pairs = tuple((str(label), _unit(value, f"{where}: choices[{label!r}]")) for label, value in choices.items())
    elif choices is not None:
        raise InputError(f"{where}: choices apply to parser=choice only")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise InputError(f"{where}: scale={scale!r} must be a positive number (e.g. 10 for a score out of 10)")
    return JudgeQuestion(prompt, parser, pairs, float(scale), _unit(unparsable, f"{where}: unparsable"),
                         rule_function(str(rule), f"{where} rule") if rule else None)


def _unit(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise InputError(f"{what}={value!r} must be a number in [0, 1]")
    return float(value)


def _check_template(prompt: str, where: str) -> None:
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(prompt) if name is not None]
    except ValueError as error:
        raise InputError(f"{where}: the judge's prompt is not a template ({error}); write a literal brace as {{{{ or }}}}") from None
    for name in fields:
        if name not in FIELDS[:-1] and not re.fullmatch(r"extra_info\[[^\]]+\]", name):
            raise InputError(f"{where}: the judge's prompt names {{{name}}}; it may name {{answer}}, {{ground_truth}}, {{question}}, "
                             "{data_source} and {extra_info[KEY]}")
    try:  # a format spec or conversion a text cannot take ({answer:d}) fails here, not at every scoring call
        prompt.format_map({name: "text" for name in FIELDS[:-1]} | {"extra_info": _AnyKey()})
    except (ValueError, TypeError, AttributeError) as error:
        raise InputError(f"{where}: the judge's prompt cannot be filled with text ({error}); drop the format spec") from None


class _AnyKey(dict):
    def __missing__(self, key: str) -> str:
        return "text"


def gold_text(ground_truth: Any) -> str:
    """The gold answers as the judge reads them (``search_answer.gold_answers``: a str, a list, ``{"target": [...]}``)
    joined by " / "; any other ground truth as its text."""
    try:
        return " / ".join(gold_answers(ground_truth))
    except ValueError:  # a structure only a rule reads
        return str(ground_truth)


def reference_answer(ground_truth: Any) -> str | None:
    """A right answer to a row, for the agreement check: its gold answer (the first of several); None when
    the ground truth is not one (a structure only a rule reads)."""
    try:
        answer = gold_answers(ground_truth)[0]
    except ValueError:
        return None
    return answer if answer.strip() else None


def last_user_text(prompt: Sequence[Mapping[str, Any]] | None) -> str:
    """The content of the row's last user message ("" without one)."""
    return next((str(m.get("content") or "") for m in reversed(list(prompt or ())) if m.get("role") == "user"), "")


def ask(client: EnvLLM, conversations: Sequence[Messages], timeout_s: float | None) -> list[Any] | None:
    """The client's replies to every conversation, in one batched request under one deadline; None when the
    request did not return in ``timeout_s`` (None: no deadline; its thread is left to end). What the client
    raises is raised here: the Env-LLM worker's death is the run's failure, which a restart resumes (a server
    at a URL answers failures as failed replies instead)."""
    if not conversations:
        return []
    box: dict[str, Any] = {}

    def request() -> None:
        try:
            box["replies"] = client.chat(conversations)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = error

    thread = threading.Thread(target=request, name="posttrain-judge", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "error" in box:
        raise box["error"]
    return list(box["replies"]) if "replies" in box else None


@dataclass
class Judged:
    """Each judge part's value per answer (NaN: not scored), and per answer 1 where its question failed or its
    reply could not be read; ``asked`` counts the questions (sent, or failed to render), ``failures`` those with no reply."""

    values: dict[str, np.ndarray]
    failed: dict[str, np.ndarray]
    unread: dict[str, np.ndarray]
    asked: int = 0
    failures: int = 0
    late: bool = False


def judge_answers(parts: Sequence[Any], client: EnvLLM, timeout_s: float | None, answers: Sequence[Any],
                  scored: np.ndarray, columns: Mapping[str, np.ndarray]) -> Judged:
    """The judge parts (rubric parts with a ``judge``) for every answer the scoring call ``scored`` (answers carry
    ``text``, ``ground_truth``, ``prompt``, ``data_source``, ``extra_info``): 1 where the part's rule accepted it
    (``columns``' ``rubric/<name>/rule``), else its question, all in one request (:func:`ask`)."""
    rows = len(answers)
    judged = Judged({p.name: np.full(rows, np.nan) for p in parts}, {p.name: np.zeros(rows) for p in parts},
                    {p.name: np.zeros(rows) for p in parts})
    asked, conversations = [], []
    for part in parts:
        by_rule = columns.get(f"rubric/{part.name}/rule")
        for row, answer in enumerate(answers):
            if answer is None or not scored[row]:
                continue
            if by_rule is not None and by_rule[row] == 1.0:
                judged.values[part.name][row] = 1.0
                continue
            try:
                conversations.append(part.judge.messages(answer.text, answer.ground_truth, answer.prompt, answer.data_source, answer.extra_info))
                asked.append((part, row))
            except (KeyError, IndexError, TypeError, ValueError):  # the template names an extra_info key this row lacks
                judged.values[part.name][row], judged.failed[part.name][row] = 0.0, 1.0
                judged.asked, judged.failures = judged.asked + 1, judged.failures + 1
    replies = ask(client, conversations, timeout_s)
    judged.late, judged.asked = replies is None and bool(conversations), judged.asked + len(asked)
    for (part, row), reply in zip(asked, replies or [None] * len(asked)):
        if reply is None or reply.failed:
            judged.values[part.name][row], judged.failed[part.name][row] = 0.0, 1.0
            judged.failures += 1
            continue
        value = part.judge.read(reply.text)
        judged.values[part.name][row] = part.judge.unparsable if value is None else value
        judged.unread[part.name][row] = float(value is None)
    return judged


def accepted(value: Any) -> bool:
    """A rule's verdict on an answer: its ``acc`` where it reports one, else score >= 1."""
    if isinstance(value, Mapping):
        return bool(value["acc"]) if value.get("acc") is not None else float(value["score"]) >= 1.0
    return float(value) >= 1.0


@dataclass(frozen=True)
class Agreement:
    right: tuple[int, int]  # (agreed, asked) on right answers: the rows' own gold answers, which the rule accepts
    wrong: tuple[int, int]  # (agreed, asked) on wrong ones: another row's gold answer, which the rule rejects
    readable: int           # replies the parser could read (a failed or unreadable one counts as a disagreement)

    @property
    def agreed(self) -> int:
        return self.right[0] + self.wrong[0]

    @property
    def asked(self) -> int:
        return self.right[1] + self.wrong[1]

    @property
    def share(self) -> float:
        """The share of the questions whose verdict equals the rule's (0 when none was asked)."""
        return self.agreed / self.asked if self.asked else 0.0

    @property
    def decided(self) -> bool:
        """Whether the check had right and wrong answers both: else it says nothing of the judge."""
        return self.right[1] > 0 and self.wrong[1] > 0


def agreement(question: JudgeQuestion, client: EnvLLM, rows: Sequence[tuple[Any, Any, Any, Any]],
              timeout_s: float | None = None) -> Agreement:
    """How often the judge agrees with its rule on answers the rule decides: for each row
    ``(prompt, ground_truth, data_source, extra_info)`` whose gold answer the rule accepts, that answer, and
    the gold answer of the next row that the rule rejects for it. One batched request; a reply that failed
    or could not be read counts as a disagreement, so a judge that never answers readably agrees on nothing,
    and one that always answers the same on about half. An InputError where the prompt names an
    ``extra_info`` key a row lacks."""
    from posttrain.rewards.registry import context_keywords

    if question.rule is None:
        raise ValueError("the agreement check needs the judge's rule")
    keywords = context_keywords(question.rule)

    def rule_says(answer: str, truth: Any, source: Any, info: Any) -> bool:
        context = {"data_source": source, "extra_info": info}
        return accepted(question.rule(solution_str=answer, ground_truth=truth, **{k: context[k] for k in keywords if k in context}))

    readable = [row for row in rows if reference_answer(row[1]) is not None]
    pairs: list[tuple[list[dict[str, str]], bool]] = []
    for index, (prompt, truth, source, info) in enumerate(readable):
        own = reference_answer(truth)
        if not rule_says(own, truth, source, info):
            continue  # a row its rule does not accept its own gold answer for decides nothing
        others = (reference_answer(readable[(index + step) % len(readable)][1]) for step in range(1, len(readable)))
        wrong = next((answer for answer in others if not rule_says(answer, truth, source, info)), None)
        for answer, verdict in ((own, True), (wrong, False)):
            if answer is None:
                continue
            try:
                pairs.append((question.messages(answer, truth, prompt, source, info), verdict))
            except (KeyError, IndexError) as error:
                raise InputError(f"the judge's prompt names {error} of extra_info, which a row lacks; name keys every row has") from None
    if len({verdict for _, verdict in pairs}) < 2:  # no right answer or no wrong one: nothing to ask (Agreement.decided)
        return Agreement((0, sum(v for _, v in pairs)), (0, sum(not v for _, v in pairs)), 0)
    replies = ask(client, [messages for messages, _ in pairs], timeout_s) or [None] * len(pairs)
    values = [question.read(reply.text) if reply is not None and not reply.failed else None for reply in replies]
    counts = {True: [0, 0], False: [0, 0]}
    for value, (_, verdict) in zip(values, pairs):
        counts[verdict][1] += 1
        counts[verdict][0] += value is not None and (value >= 0.5) == verdict
    return Agreement(tuple(counts[True]), tuple(counts[False]), sum(v is not None for v in values))
