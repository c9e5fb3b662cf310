"""Reading a final numeric answer out of a model's text, and scoring it against a reference number.

Two ways to find the answer:
  * ``strict``   — the number after the last ``####`` marker (``"... #### 72"``);
  * ``flexible`` — the last number anywhere in the text.

Numbers are compared by value after normalising: thousands separators and ``$`` signs are dropped
and ``72.0``/``72.00`` equal ``72`` (exact decimal arithmetic, no float rounding).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

ANSWER_MARKER = "####"
METHODS = ("strict", "flexible")
# A number as models write it: optional sign and dollar sign, digits with optional thousands
# separators, an optional decimal part. "1,000.50", "-$3", "$-3", "42".
_NUMBER = r"-?\$?-?\d(?:[\d,]*\d)?(?:\.\d+)?"
_MARKED_NUMBER = re.compile(re.escape(ANSWER_MARKER) + r"\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)


def normalize_number(text: str) -> Decimal | None:
    """The value of ``text`` as written by a model or a dataset (``"$1,000.0"`` → 1000), else None."""
    cleaned = str(text).strip().replace(",", "").replace("$", "").rstrip(".")
    if cleaned.startswith("--"):
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The answer string found in ``text`` by ``method`` (see the module docstring), or None."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; use one of {METHODS}")
    pattern = _MARKED_NUMBER if method == "strict" else _ANY_NUMBER
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def score_numeric_answer(
    solution_str: str,
    ground_truth: str | int | float,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    integer_only: bool = False,
) -> dict[str, float | str | None]:
    """Score a final numeric answer.

    Returns ``{"score", "acc", "format", "pred"}``: ``score`` when the answer equals ``ground_truth``,
    ``format_score`` when an answer was found (``format`` = 1) but is wrong, and 0 when none was
    found. With ``integer_only`` an answer with a fractional part is wrong. ``pred`` is the answer
    read (normalised, for majority votes), None when there was none.
    """
    answer = extract_answer(solution_str, method)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format": 0.0, "pred": None}
    value, reference = normalize_number(answer), normalize_number(ground_truth)
    if reference is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number")
    correct = value is not None and value == reference and not (integer_only and value != value.to_integral_value())
    pred = format(value.normalize(), "f") if value is not None else answer
    return {"score": float(score if correct else format_score), "acc": float(correct), "format": 1.0, "pred": pred}
