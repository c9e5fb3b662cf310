"""A reward made of named parts with weights (``reward.rubric``), each part a rule: a data source's score
function by name, a training rule of posttrain's (``registry.RULES``), or your own ``FILE.py:FUNCTION``::

    reward:
      rubric:
        - {name: correct, weight: 1.0, rule: arithmetic}         # the arithmetic data source's function
        - {name: brief, weight: 0.25, rule: my_rules.py:brief}  # yours, called as any score function

A :class:`Rubric` is itself a score function, so it goes through the one reward path (rewards/manager.py:
in the scoring process, with a deadline per answer, failures counted) in place of the data source's
function. It returns

- ``score``: the weighted mean of the parts, sum(weight × part) / sum(weight);
- ``rubric/<name>``: each part's own score, logged per step as ``reward/<name>`` (the mean over the
  answers scored) and written into validation's episode files beside the score;
- ``rubric/<name>/errors``: 1 where that part raised or returned no usable score (it then counts 0 in the
  mean), logged as ``reward/<name>/errors`` (a count), so one broken part shows without failing the answer;
- ``acc``: where a part reports its own ``acc``, whether every part that reported one said yes (else the
  manager's rule: score ≥ 1).

Each part gets what any score function gets (``solution_str``, ``ground_truth``, and ``data_source``,
``extra_info``, ``calls`` where it names them).

A part may be a judge instead of a rule (``{name, weight, judge: {prompt, parser, ...}}``, rewards/judge.py):
an LLM asked about the answer. The rubric, run in the scoring process, runs only a judge part's own
``rule`` (``rubric/<name>/rule``: 1 where the rule accepts the answer, so the judge is not asked); the
reward manager asks the judge for the rest in one batched request, fills ``rubric/<name>`` and computes
the weighted mean of every part (rewards/manager.py).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posttrain.errors import InputError, PosttrainError
from posttrain.rewards.custom import FileScoreFunction
from posttrain.rewards.judge import JudgeQuestion, accepted, build_question
from posttrain.rewards.registry import DEFAULT_SCORE_FUNCTIONS, RULES, ScoreFunction, context_keywords

PREFIX = "rubric/"  # the extras a rubric returns; the manager logs them as reward/<name>
RESERVED_NAMES = frozenset({"samples", "errors", "timeouts", "empty_responses", "overlong_fraction"})  # reward/<name> counts of their own


@dataclass(frozen=True)
class RubricPart:
    name: str
    weight: float
    function: ScoreFunction | None       # a rule part's function; None for a judge part
    judge: JudgeQuestion | None = None   # a judge part's question


def rule_function(rule: str, where: str) -> ScoreFunction:
    """The score function ``rule`` names: a data source (posttrain's registry), a rule of posttrain's
    (``registry.RULES``: ``bfcl_arguments``, ``bfcl_parameters``, ``bfcl_parameters_per_call``,
    ``bfcl_arguments_per_call``, ``bfcl_calls_count``, ``bfcl_no_extra_calls``, ``bfcl_decline``) or ``FILE.py:FUNCTION``."""
    if rule in DEFAULT_SCORE_FUNCTIONS or rule in RULES:
        return DEFAULT_SCORE_FUNCTIONS.get(rule) or RULES[rule]
    path, colon, name = str(rule).rpartition(":")
    if colon and path.endswith(".py") and name:
        try:
            return FileScoreFunction(path, name)
        except (PosttrainError, TypeError) as error:  # no such file or function, or it cannot be called as a rule
            raise InputError(f"{where}: {error}") from None
    raise InputError(f"{where}: rule={rule!r} is neither a data source with a score function "
                     f"({', '.join(sorted(DEFAULT_SCORE_FUNCTIONS))}), a rule of posttrain's ({', '.join(sorted(RULES))}) "
                     f"nor FILE.py:FUNCTION")


def build_rubric(parts: Sequence[Mapping[str, Any]]) -> Rubric:
    """The rubric of ``reward.rubric``'s entries (``name``, ``weight``, and ``rule`` or ``judge``); an InputError
    naming the entry for a missing or repeated name, a weight that is not a positive number, a rule that names
    nothing, a judge that cannot work (rewards/judge.py), a part with both or neither."""
    built: list[RubricPart] = []
    for index, part in enumerate(parts):
        where = f"reward.rubric[{index}]"
        part = dict(part)
        name, weight, rule, judge = part.pop("name", None), part.pop("weight", 1.0), part.pop("rule", None), part.pop("judge", None)
        if part:
            raise InputError(f"{where}: unknown keys {sorted(part)}; a part has name, weight, and rule or judge")
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise InputError(f"{where}: name={name!r}: give each part a name (no '/'), e.g. correct")
        if name in RESERVED_NAMES:
            raise InputError(f"{where}: name={name!r} is the reward path's own reward/{name} count; call the part otherwise")
        if name in {p.name for p in built}:
            raise InputError(f"{where}: name {name!r} is used twice; the parts are logged by name")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight <= 0:
            raise InputError(f"{where} ({name}): weight={weight!r} must be a positive number")
        if bool(rule) == (judge is not None):
            raise InputError(f"{where} ({name}): give it a rule (a data source, e.g. arithmetic, a rule of posttrain's, or FILE.py:FUNCTION) "
                             "or a judge ({prompt, parser}), one of the two")
        if judge is not None:
            built.append(RubricPart(name, float(weight), None, build_question(judge, f"{where} ({name})", rule_function)))
        else:
            built.append(RubricPart(name, float(weight), rule_function(str(rule), f"{where} ({name})")))
    if not built:
        raise InputError("reward.rubric is empty; give at least one part, or leave it out")
    return Rubric(built)


class Rubric:
    """A score function made of weighted parts (module docstring). Picklable: its parts are module-level
    functions or :class:`FileScoreFunction` s, so it runs in the scoring process like any score function."""

    def __init__(self, parts: Sequence[RubricPart]) -> None:
        self.parts = tuple(parts)

    @property
    def judged(self) -> tuple[RubricPart, ...]:
        """The judge parts, which the reward manager completes (module docstring)."""
        return tuple(p for p in self.parts if p.judge is not None)

    @property
    def __signature__(self) -> inspect.Signature:
        keyword = inspect.Parameter.KEYWORD_ONLY
        names = ("solution_str", "ground_truth", "data_source", "extra_info", "calls")
        return inspect.Signature([inspect.Parameter(n, keyword, default=None if n not in ("solution_str", "ground_truth") else inspect.Parameter.empty)
                                  for n in names])

    def __call__(self, *, solution_str: str, ground_truth: Any, data_source: str | None = None,
                 extra_info: Mapping[str, Any] | None = None, calls: Any = None) -> dict[str, Any]:
        context = {"data_source": data_source, "extra_info": extra_info, "calls": calls}
        out: dict[str, Any] = {}
        weighted = weights = 0.0
        accs: list[bool] = []
        for part in self.parts:
            function = part.function if part.judge is None else part.judge.rule
            if function is None:
                continue  # a judge part without a rule: the manager asks the judge about every answer
            given = {k: context[k] for k in context_keywords(function) if k != "calls" or calls is not None}
            try:
                value = function(solution_str=solution_str, ground_truth=ground_truth, **given)
                score, acc = _part_score(value)
                failed = 0.0
            except Exception:  # noqa: BLE001 - a user's rule: this part scores 0 and is counted, the answer is still scored
                score, acc, failed = 0.0, None, 1.0
            if part.judge is not None:  # the judge's rule: the answer it accepts needs no judge
                out[f"{PREFIX}{part.name}/rule"] = float(not failed and accepted({"score": score, "acc": acc}))
                continue
            out[f"{PREFIX}{part.name}"], out[f"{PREFIX}{part.name}/errors"] = score, failed
            weighted, weights = weighted + part.weight * score, weights + part.weight
            if acc is not None:
                accs.append(acc)
        out["score"] = weighted / weights if weights else 0.0  # the rule parts' mean; with judges the manager's is final
        if accs:
            out["acc"] = all(accs)
        return out

    def combine_rows(self, columns: Mapping[str, np.ndarray], judged: Mapping[str, np.ndarray], scored: np.ndarray,
                     scores: Any) -> tuple[Any, np.ndarray]:
        """Each scored row's score and acc over all its parts: the rule parts' values in ``columns``
        (``rubric/<name>``, and its ``acc``), the judge parts' in ``judged``; ``scores`` (B,) updated in place."""
        acc = columns.get("acc")
        acc = np.full(len(scored), np.nan) if acc is None or acc.dtype != np.float64 else acc.copy()
        for row in np.flatnonzero(scored):
            parts = {p.name: float(columns[f"{PREFIX}{p.name}"][row]) for p in self.parts if p.judge is None}
            parts |= {name: float(values[row]) for name, values in judged.items()}
            accs = [bool(acc[row])] if not np.isnan(acc[row]) else []
            accs += [parts[p.name] >= 1.0 for p in self.judged if p.judge.verdict]
            scores[row], verdict = self.combine(parts, accs)
            acc[row] = np.nan if verdict is None else float(verdict)
        return scores, acc

    def combine(self, parts: Mapping[str, float], accs: Sequence[bool]) -> tuple[float, bool | None]:
        """The answer's score, the weighted mean of every part's value (``parts``, by name), and its ``acc``:
        whether every part that reported one (``accs``) said yes; None when none did."""
        score = sum(p.weight * parts[p.name] for p in self.parts) / sum(p.weight for p in self.parts)
        return score, (all(accs) if accs else None)

    def __repr__(self) -> str:
        return "Rubric(" + ", ".join(f"{p.name}×{p.weight:g}" for p in self.parts) + ")"


def _part_score(value: Any) -> tuple[float, bool | None]:
    """A part's (score, acc) from what its rule returned: a number or a dict with ``score`` (and ``acc``)."""
    acc = None
    if isinstance(value, Mapping):
        acc = value.get("acc")
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"a rubric part returned {value!r}")
    return float(value), None if acc is None else bool(acc)
