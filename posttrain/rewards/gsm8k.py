"""GSM8K score: the final answer after ``####`` (strict) or the last number (flexible).

The GSM8K preparer's prompt asks for the final answer after ``####``; the ground truth is the
reference number (``"72"``). Follows verl's ``gsm8k.compute_score`` in meaning (1 for correct,
``format_score`` for a found but wrong answer, 0 otherwise), but compares numbers by value, so
``"$1,000.00"`` matches ``"1000"``.
"""

from __future__ import annotations

from posttrain.rewards.numeric import score_numeric_answer


def compute_score(
    solution_str: str,
    ground_truth: str,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, float]:
    """``{"score", "acc", "format"}`` for one response; see :func:`score_numeric_answer`."""
    return score_numeric_answer(solution_str, ground_truth, method=method, format_score=format_score, score=score)
