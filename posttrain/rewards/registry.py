"""Which score function scores which ``data_source``.

A score function is a plain callable ``score(solution_str, ground_truth, **kwargs) -> float | dict``
(a dict holds at least ``"score"``, plus extras such as ``"acc"``). It may also take ``data_source``,
``extra_info`` and ``calls`` (the parsed calls, where the calls are the answer: BFCL's one-turn rows)
keywords; the reward manager passes them only to functions that accept them.

To score a data source of your own, either give the manager a table with it added::

    RewardManager(tokenizer, score_functions={**DEFAULT_SCORE_FUNCTIONS, "my_source": my_score})

or point ``custom_reward_function.path`` / ``.name`` at a function in a .py file, which then scores
every sample whatever its data source. Bind options with ``functools.partial``
(``partial(gsm8k.compute_score, format_score=0.1)``).

A table's functions compare the response with the sample's ground truth, so a run scored by a
table refuses at load (the rollout's ``check_data``) a row whose data source is not in it
(:func:`unknown_source_fix`) or whose ground truth is missing (:func:`lacks_ground_truth`). A custom
function is given whatever the row holds and decides for itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.rewards import arithmetic, bfcl, bfcl_credits, bfcl_mistakes, gsm8k, math_answer, reasoning_gym, search_answer, textarena_outcomes

ScoreFunction = Callable[..., "float | dict[str, Any]"]

# Keyword arguments of one call: what every score function takes, and what it may take.
REQUIRED_KEYWORDS = ("solution_str", "ground_truth")
CONTEXT_KEYWORDS = ("data_source", "extra_info", "calls")  # calls: where the calls are the answer (None otherwise)
# The batched calling convention: the same, one list per keyword.
BATCHED_REQUIRED_KEYWORDS = ("solution_strs", "ground_truths")
BATCHED_CONTEXT_KEYWORDS = ("data_sources", "extra_infos", "calls")  # calls: one list (or None) per sample

DEFAULT_SCORE_FUNCTIONS: Mapping[str, ScoreFunction] = MappingProxyType(
    {
        "openai/gsm8k": gsm8k.compute_score,
        "gsm8k": gsm8k.compute_score,
        "arithmetic": arithmetic.compute_score,
        "math": math_answer.compute_score,
        "lighteval/MATH": math_answer.compute_score,
        "DigitalLearningGmbH/MATH-lighteval": math_answer.compute_score,
        "HuggingFaceH4/MATH-500": math_answer.compute_score,
        "synthetic_search": search_answer.compute_score,  # the search task's answer, for a tool-calling agent
        # the doctor's diagnosis by exact name (the rule of its judge part: docs/rewards.md)
        "synthetic_doctor": functools.partial(search_answer.compute_score, tag="diagnosis"),
        "doctor": functools.partial(search_answer.compute_score, tag="diagnosis"),  # your cases (posttrain prepare doctor-json)
        bfcl.DATA_SOURCE: bfcl.compute_score,  # BFCL's own AST checker on the calls (bfcl-eval, imported when first called)
        # the task's own score_answer on the item regenerated from the row (reasoning-gym, imported by the scoring process)
        reasoning_gym.DATA_SOURCE: reasoning_gym.SCORE_FUNCTION,
    }
)

# Rules a rubric part may name (reward.rubric's rule) that are no data source's score function: training
# rewards of their own, beside the data source's judge (rewards/rubric.py)
RULES: Mapping[str, ScoreFunction] = MappingProxyType({
    "bfcl_arguments": bfcl_credits.argument_credit,  # part credit for the right function's parameters, judged one by one by BFCL's checker
    "bfcl_parameters": bfcl_credits.parameter_credit,  # the needed parameters a call to the right function names, whatever their values
    "bfcl_parameters_per_call": bfcl_credits.calls_parameter_credit,  # the same for each call of a row of one call or several
    "bfcl_arguments_per_call": bfcl_credits.calls_argument_credit,  # bfcl_arguments for each call of a row of one call or several
    "bfcl_calls_count": bfcl_credits.calls_count_credit,  # min(calls written, calls wanted) / max of them, whatever the calls say
    "bfcl_no_extra_calls": bfcl_credits.no_extra_calls_credit,  # 0 for more calls than the row wants, else 1 (no-call rows: 1)
    "bfcl_decline": bfcl_credits.decline_credit,  # 1 for an answer with no call: beside BFCL's verdict, declining ranks above a wrong call
})

# What a recipe's report adds for a data source's rows, beside their accuracies: its section's title, and
# label -> episodes file in, Markdown out (empty for none of that source's rows)
MISTAKES: Mapping[str, tuple[str, Callable[[Mapping[str, Path]], str]]] = MappingProxyType({
    bfcl.DATA_SOURCE: ("Mistakes by kind", bfcl_mistakes.mistakes_markdown),
    # won, lost with every move valid or with invalid moves, unfinished
    textarena_outcomes.DATA_SOURCE: ("How the games ended", textarena_outcomes.outcomes_markdown),
})


class UnknownDataSourceError(PosttrainError, KeyError):
    """No score function is registered for a sample's data_source; exit code 2. Still a KeyError."""

    exit_code = 2

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


# What to do about a row whose ground truth a table's function cannot compare with.
GROUND_TRUTH_FIX = (
    "the built-in score functions compare the response with reward_model.ground_truth: fill it in "
    "(the expected answer, e.g. '42'), drop those rows, or set custom_reward_function.path/.name to your "
    "own function, which is given whatever the row holds"
)


def score_function_for(data_source: str, functions: Mapping[str, ScoreFunction] = DEFAULT_SCORE_FUNCTIONS) -> ScoreFunction:
    """The function that scores ``data_source``; UnknownDataSourceError says how to add one."""
    try:
        return functions[data_source]
    except KeyError:
        raise UnknownDataSourceError(f"no score function for data_source {data_source!r}; {unknown_source_fix(functions)}") from None


def unknown_source_fix(functions: Mapping[str, ScoreFunction] = DEFAULT_SCORE_FUNCTIONS) -> str:
    """What to do about a data source that ``functions`` has no entry for."""
    return (
        f"known data sources: {sorted(functions)}. Write the data_source column with one of these, set "
        "custom_reward_function.path (a .py file) and custom_reward_function.name (a function "
        "score(solution_str, ground_truth, ...)) to score every sample with your own function, or pass "
        "score_functions={**DEFAULT_SCORE_FUNCTIONS, data_source: fn} to the reward manager"
    )


def lacks_ground_truth(ground_truth: Any) -> bool:
    """Whether ``ground_truth`` gives a table's function nothing to compare with: None, or empty
    (a blank string, an empty list or struct)."""
    if isinstance(ground_truth, str):
        return not ground_truth.strip()
    if isinstance(ground_truth, (list, tuple, dict)):
        return len(ground_truth) == 0
    return ground_truth is None


def context_keywords(function: ScoreFunction, optional: Sequence[str] = CONTEXT_KEYWORDS) -> tuple[str, ...]:
    """The names in ``optional`` that ``function`` accepts as keyword arguments."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return tuple(optional)
    names = {p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return tuple(name for name in optional if name in names)


def check_callable_with(
    function: ScoreFunction,
    label: str,
    required: Sequence[str] = REQUIRED_KEYWORDS,
    optional: Sequence[str] = CONTEXT_KEYWORDS,
) -> None:
    """Raise TypeError, naming ``label`` and the fix, unless the manager's keyword call fits ``function``."""
    names = [*required, *context_keywords(function, optional)]
    try:
        inspect.signature(function).bind(**dict.fromkeys(names))
    except TypeError as error:
        raise TypeError(
            f"score function {label} cannot be called as {label}({', '.join(f'{n}=...' for n in names)}): "
            f"{error}. A score function takes keyword arguments {', '.join(required)} (and may take "
            f"{', '.join(optional)}); give every other parameter a default or set it through reward_kwargs"
        ) from None
