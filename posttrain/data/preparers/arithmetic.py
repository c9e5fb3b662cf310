"""Procedural integer arithmetic problems (``37 + 8 * 12``), seeded, in verl's row format.

Each problem has ``num_operands`` operands of exactly ``digits`` digits (0–9 when ``digits`` is 1)
joined by operators drawn from ``operators`` (``+``, ``-``, ``*``; ``*`` binds tighter, as usual).
The ground truth is the integer value as a string. A training row's ``extra_info.reference_answer`` is a
right answer in the prompt's format (``3 + 4 = 7`` then ``#### 7``: :func:`reference_text`), for
``algorithm.guidance``; held-out rows have none.

The prompt (:func:`prompt_text`) asks for the final answer at the end, after ``####``. Measured with
SmolLM2-135M-Instruct (greedy, 48 one-digit problems of ``+-*``): it almost never writes ``####``
(1 of 48) but ends its reply with the right number 30 times ("7 + 9 = 16"); with two-digit operands
only 3 times. Hence the defaults — one digit, two operands, the 300 such problems split 240/60 —
and :func:`posttrain.rewards.arithmetic.compute_score` reading the last number by default, which
is the number after ``####`` whenever the model follows the prompt.

Problems are drawn without repetition from ``random.Random(seed)``: the first ``train_size`` distinct
expressions form the train split and the next ``val_size`` the held-out split (``test.parquet``),
so the two never share an expression, and the same arguments always give the same files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.data.format import REFERENCE_ANSWER, make_row, write_rows
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError

DATA_SOURCE = "arithmetic"
SUPPORTED_OPERATORS = "+-*"
INSTRUCTION = 'End your reply with the final answer after "####".'
# Rejection sampling gives up after this many draws per wanted problem (a nearly exhausted space).
_DRAWS_PER_PROBLEM = 50


@dataclass(frozen=True)
class Problem:
    operands: tuple[int, ...]
    operators: tuple[str, ...]

    @property
    def expression(self) -> str:
        parts = [str(self.operands[0])]
        for operator, operand in zip(self.operators, self.operands[1:]):
            parts += [operator, str(operand)]
        return " ".join(parts)

    @property
    def value(self) -> int:
        """The value with ``*`` before ``+``/``-``, left to right."""
        terms, signs = [self.operands[0]], []
        for operator, operand in zip(self.operators, self.operands[1:]):
            if operator == "*":
                terms[-1] *= operand
            else:
                signs.append(operator)
                terms.append(operand)
        total = terms[0]
        for sign, term in zip(signs, terms[1:]):
            total = total + term if sign == "+" else total - term
        return total


def prompt_text(problem: Problem) -> str:
    return f"What is {problem.expression}? {INSTRUCTION}"


def reference_text(problem: Problem) -> str:
    """A right answer as the prompt asks for it: the working, then the value after ``####``."""
    return f"{problem.expression} = {problem.value}\n#### {problem.value}"


def generate_problems(count: int, *, digits: int, num_operands: int, operators: str, seed: int) -> list[Problem]:
    """``count`` distinct problems in a fixed order for ``seed``."""
    check_problem_space(count, digits, num_operands, operators)
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rng = random.Random(seed)
    seen: set[Problem] = set()
    problems: list[Problem] = []
    for _ in range(count * _DRAWS_PER_PROBLEM):
        problem = Problem(
            tuple(rng.randint(low, high) for _ in range(num_operands)),
            tuple(rng.choice(operators) for _ in range(num_operands - 1)),
        )
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)
            if len(problems) == count:
                return problems
    raise InputError(
        f"found only {len(problems)} distinct problems of the {count} asked for; use more digits, "
        "operands or operators, or fewer problems"
    )


def check_problem_space(count: int, digits: int, num_operands: int, operators: str) -> None:
    """InputError unless ``count`` distinct problems of these digits, operands and operators exist."""
    if digits < 1 or num_operands < 2 or count < 1:
        raise InputError(f"need digits >= 1, num_operands >= 2 and at least one problem; got {digits=}, {num_operands=}, {count=}")
    unknown = sorted(set(operators) - set(SUPPORTED_OPERATORS))
    if not operators or unknown:
        raise InputError(f"operators={operators!r}: use a non-empty string of {SUPPORTED_OPERATORS!r}, e.g. '+-'")
    distinct_values = 10**digits - (0 if digits == 1 else 10 ** (digits - 1))
    space = distinct_values**num_operands * len(set(operators)) ** (num_operands - 1)
    if count > space:
        raise InputError(
            f"asked for {count} distinct problems but only {space} exist with {digits} digit(s), "
            f"{num_operands} operands and operators {operators!r}; lower train_size/val_size or widen the problems"
        )


def prepare_arithmetic(
    out_dir: Path,
    *,
    train_size: int = 240,
    val_size: int = 60,
    digits: int = 1,
    num_operands: int = 2,
    operators: str = "+-*",
    seed: int = 0,
    levels: str | list[int] | None = None,
) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` (the held-out split) into ``out_dir``.

    ``levels``: digits per difficulty level, comma-separated (``"1,2,3"``; in a preset also a list): ``train_size`` and ``val_size``
    problems of each, ``extra_info.level`` their digits (for ``data.sampler.curriculum.key=extra_info.level``),
    in place of ``digits``."""
    per_level = checked_options(dict(locals()))
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    for level, level_digits in enumerate(per_level):
        problems = generate_problems(train_size + val_size, digits=level_digits, num_operands=num_operands, operators=operators,
                                     seed=seed + level)
        for split, items in (("train", problems[:train_size]), ("test", problems[train_size:])):
            splits[split] += [_row(p, split, len(splits[split]), None if levels is None else level_digits) for p in items]
    return [write_rows(rows, Path(out_dir) / f"{split}.parquet") for split, rows in splits.items()]


def checked_options(given: dict[str, Any]) -> list[int]:
    """The digits of each level (``[digits]`` without levels) from prepare_arithmetic's arguments, once every refusal
    they call for alone has passed, the space of distinct problems included (also ``preparers.check_options``'s)."""
    check_counts(1, train_size=given["train_size"], val_size=given["val_size"])
    per_level = _levels(given["levels"]) if given["levels"] is not None else [given["digits"]]
    for digits in per_level:
        check_problem_space(given["train_size"] + given["val_size"], digits, given["num_operands"], given["operators"])
    return per_level


def _levels(levels: str | list[int]) -> list[int]:
    try:
        parsed = [int(part) for part in (levels if isinstance(levels, (list, tuple)) else str(levels).split(","))]
    except ValueError:
        raise InputError(f"levels={levels!r}: digits per level, comma-separated, e.g. '1,2,3'") from None
    if len(set(parsed)) != len(parsed) or len(parsed) < 2:
        raise InputError(f"levels={levels!r}: at least two different digit counts, e.g. '1,2,3'")
    return parsed


def _row(problem: Problem, split: str, index: int, level: int | None = None) -> dict:
    extra = {"split": split, "index": index, "expression": problem.expression} | ({} if level is None else {"level": level})
    if split == "train":  # a right answer in the prompt's format, for algorithm.guidance (rollout/guidance.py)
        extra[REFERENCE_ANSWER] = reference_text(problem)
    return make_row(
        data_source=DATA_SOURCE,
        messages=[{"role": "user", "content": prompt_text(problem)}],
        ground_truth=str(problem.value),
        ability="arithmetic",
        extra_info=extra,
    )
