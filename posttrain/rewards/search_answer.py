"""Score for a question-answering agent's final reply (the ``synthetic_search`` data source), and
the SQuAD answer normalisation that the search environment's exact match uses too.

The reply's answer is the text inside ``<answer>…</answer>`` when there is such a block, else the
whole reply (a trailing full stop dropped); it scores 1.0 when it equals a gold answer after
:func:`normalize_answer`, else 0. A long reply that merely contains the answer scores 0, so listing
candidates earns nothing.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation (as Search-R1 uses it): lower case, punctuation deleted, articles removed, spaces collapsed.

    Punctuation is deleted, not replaced by a space: ``"Eiffel-Tower"`` becomes ``"eiffeltower"``.
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def gold_answers(ground_truth: Any) -> tuple[str, ...]:
    """The gold answers in ``ground_truth``: a str, a list/tuple/array of str, or a dict with ``"target"``."""
    if isinstance(ground_truth, Mapping):
        if "target" not in ground_truth:
            raise ValueError(f"ground truth {ground_truth!r} has no 'target'; write it as {{'target': ['answer', ...]}}")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, str):
        return (ground_truth,)
    if hasattr(ground_truth, "tolist"):  # numpy array, as Parquet columns arrive
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, (list, tuple)) and ground_truth and all(isinstance(g, str) for g in ground_truth):
        return tuple(ground_truth)
    raise ValueError(
        f"ground truth {ground_truth!r} is not an answer; give a str, a non-empty list of str, "
        "or {'target': [answer, *aliases]} (what `posttrain prepare synthetic-search` writes)"
    )


def exact_match(prediction: str, golds: Any) -> bool:
    """Whether ``prediction`` equals any gold answer after :func:`normalize_answer`."""
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in gold_answers(golds))


def compute_score(solution_str: str, ground_truth: Any, tag: str = "answer") -> dict[str, float]:
    """1.0 when the reply's answer (inside ``<tag>…</tag>`` if there is such a block, else the whole reply)
    equals a gold answer after :func:`normalize_answer`; ``tag="diagnosis"`` is the doctor's rule
    (``synthetic_doctor``: the diagnosis exactly, as :class:`~posttrain.agents.doctor.env.DoctorEnv` checks it)."""
    found = _ANSWER.search(solution_str) if tag == "answer" else re.search(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", solution_str, re.DOTALL)
    answer = (found.group(1) if found else solution_str).strip().rstrip(".")
    right = float(exact_match(answer, ground_truth))
    return {"score": right, "acc": right}
