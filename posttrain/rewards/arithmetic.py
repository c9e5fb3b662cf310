"""Score for the procedural arithmetic problems: the final integer answer, exact match.

The arithmetic preparer's prompt asks the model to end its reply with the final answer after
``####``. By default (``method="flexible"``) the answer read is the last number in the reply: that
is the number after ``####`` when the model follows the prompt, and still the answer when a small
model just ends with "7 + 9 = 16" — which SmolLM2-135M-Instruct does instead of writing ``####``
(see :mod:`posttrain.data.preparers.arithmetic`), so a strict reading would leave RL with almost no
reward to learn from. ``method="strict"`` reads only the number after the last ``####``. In either
mode a found but wrong answer scores ``format_score``, and the answer must equal the integer ground
truth exactly (``16.0`` counts, ``16.5`` does not).
"""

from __future__ import annotations

from posttrain.rewards.numeric import score_numeric_answer


def compute_score(
    solution_str: str,
    ground_truth: str | int,
    *,
    method: str = "flexible",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, float]:
    """``{"score", "acc", "format"}`` for one response; see :func:`score_numeric_answer`."""
    return score_numeric_answer(
        solution_str, ground_truth, method=method, format_score=format_score, score=score, integer_only=True
    )
