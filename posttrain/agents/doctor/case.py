"""A consultation case: what the doctor is shown, what the patient knows, and the answer.

A case travels in a dataset row in verl's format (``posttrain prepare synthetic-doctor`` and
``posttrain prepare doctor --in FILE`` write it):

===================================  ======================================================
``reward_model.ground_truth``        ``{"target": [diagnosis, *aliases]}``
``extra_info.case_id``               str, unique in the dataset
``extra_info.self_report``           str, the patient's own words, shown to the doctor in the prompt
``extra_info.description``           str, the hidden case description the patient answers from
``extra_info.qa``                    list of ``{"question", "answer"}``: what a good doctor asks, and the replies
===================================  ======================================================

:func:`case_from_sample` reads it back and refuses a case without a diagnosis or a self-report,
naming the case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posttrain.errors import InputError
from posttrain.agents.env import EpisodeSample


@dataclass(frozen=True)
class QA:
    """One question a good doctor asks about this case, and the patient's answer to it."""

    question: str
    answer: str


@dataclass(frozen=True)
class Case:
    case_id: str
    self_report: str
    description: str
    diagnosis: str
    aliases: tuple[str, ...] = ()
    qa: tuple[QA, ...] = ()

    @property
    def diagnoses(self) -> tuple[str, ...]:
        """Every name that counts as the right diagnosis."""
        return (self.diagnosis, *self.aliases)

    def ground_truth(self) -> dict[str, list[str]]:
        return {"target": list(self.diagnoses)}

    def extra_info(self) -> dict[str, Any]:
        """The ``extra_info`` fields this case is stored as (a preparer adds its own beside them)."""
        return {
            "case_id": self.case_id, "self_report": self.self_report, "description": self.description,
            "qa": [{"question": pair.question, "answer": pair.answer} for pair in self.qa],
        }


class CaseError(InputError):
    """A case cannot be used; the message names the case and the missing field."""


def case_from_sample(sample: EpisodeSample) -> Case:
    """The case of a dataset row (see the module docstring); raises :class:`CaseError` naming the case."""
    extra = dict(sample.extra_info or {})
    case_id = str(extra.get("case_id") or extra.get("index") or "?")
    truth = sample.ground_truth
    targets = truth.get("target") if isinstance(truth, Mapping) else truth
    if hasattr(targets, "tolist"):
        targets = targets.tolist()
    if isinstance(targets, str):
        targets = [targets]
    names = [str(t).strip() for t in (targets or []) if str(t).strip()]
    if not names:
        raise CaseError(f"case {case_id!r} has no diagnosis: write reward_model.ground_truth as {{'target': [diagnosis, *aliases]}}")
    self_report = str(extra.get("self_report") or "").strip()
    if not self_report:
        raise CaseError(f"case {case_id!r} has no self-report: extra_info.self_report must hold the patient's own words")
    pairs = extra.get("qa")
    if hasattr(pairs, "tolist"):
        pairs = pairs.tolist()
    if not all(isinstance(p, Mapping) and "question" in p and "answer" in p for p in pairs or []):
        raise CaseError(f"case {case_id!r}: extra_info.qa must be a list of {{'question': ..., 'answer': ...}}, got {pairs!r:.200}")
    qa = tuple(QA(str(p["question"]), str(p["answer"])) for p in (pairs or []) if str(p["question"]).strip())
    description = str(extra.get("description") or "").strip() or self_report
    return Case(case_id, self_report, description, names[0], tuple(names[1:]), qa)
