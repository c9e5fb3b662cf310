"""Score for competition-math answers (MATH, MATH-500, ...) through Hugging Face's ``math-verify``.

The reference answer is LaTeX (``\\frac{1}{2}``, ``x^2+1``) or a plain number; it is wrapped in
``$...$`` when it carries no math delimiters, because ``math_verify.parse`` only reads LaTeX inside
a math environment. The response is parsed whole (``\\boxed{...}`` answers take priority) and the
two are compared symbolically with ``math_verify.verify(gold, answer)`` — the order matters.

Anything that goes wrong inside math-verify (an unparsable response, an unsupported construct)
scores 0 rather than raising. math-verify bounds its own work with ``signal.alarm``, which only
works in a process's main thread; elsewhere its timeouts are switched off here and the reward
manager's per-sample deadline is what bounds the call.
"""

from __future__ import annotations

import threading

_TIMEOUT_S = 5


def _wrap_gold(ground_truth: str) -> str:
    text = str(ground_truth).strip()
    return text if ("$" in text or "\\boxed" in text) else f"${text}$"


def compute_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """``{"score", "acc"}``: 1.0 when math-verify finds the response's answer equal to the reference."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException  # a BaseException, so `except Exception` misses it

    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(_wrap_gold(ground_truth), parsing_timeout=timeout)
        answer = parse(solution_str, parsing_timeout=timeout)
        correct = bool(gold) and bool(answer) and bool(verify(gold, answer, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # a malformed response must cost a score, never the run
        correct = False
    return {"score": float(correct), "acc": float(correct)}
