"""How a question is matched to a case, and the two patients that answer it.

**Matching.** :func:`question_similarity` is the Jaccard overlap of the two questions' content words
(lower case, letters and digits, a short stop-word list removed, a plural or ``-ing``/``-ed`` ending
cut so ``breathe``/``breathing`` meet): 1.0 for the same words, 0.0 for none shared. A question
*matches* a case question when the similarity reaches the environment's ``similarity_threshold``.
Word overlap is crude but transparent: a doctor that learned the case questions' words is rewarded,
and a human can check every match by eye.

**Patients.** :class:`RulePatient` answers from the case's question–answer pairs: the reply of the
best-matching pair at or above the threshold, else "I don't know." (a refusal). It is exact and
instant, for tests and quick runs. The LLM patient is the Env-LLM reading
:func:`~posttrain.agents.doctor.prompts.patient_messages`; :func:`clean_reply` turns its raw text into
what the doctor is shown: stripped, at most ``max_chars`` (cut after the last full sentence that fits;
the truncation is counted), and "I don't know." for an empty reply (counted too).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.agents.doctor.case import QA
from posttrain.agents.doctor.prompts import DONT_KNOW

_STOP_WORDS = frozenset(
    "a an the do does did is are was were be been you your yours i me my we it its of to in on at for with and or "
    "have has had there this that these those how what when where which who whom why can could would will "
    "about from by as if so than then them they he she his her any ever feel felt".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_REFUSALS = ("don't know", "do not know", "not sure", "cannot answer", "can't answer")


def content_words(text: str) -> frozenset[str]:
    """The words that carry a question's meaning (see the module docstring)."""
    return frozenset(_stem(word) for word in _WORD.findall(text.lower()) if word not in _STOP_WORDS)


def _stem(word: str) -> str:
    for ending in ("ing", "ed", "es", "s", "e"):
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            return word[: -len(ending)]
    return word


def question_similarity(a: str, b: str) -> float:
    """Jaccard overlap of the content words of ``a`` and ``b``, in [0, 1]."""
    words_a, words_b = content_words(a), content_words(b)
    if not words_a or not words_b:
        return 0.0
    return len(words_a & words_b) / len(words_a | words_b)


def best_match(question: str, candidates: Sequence[str], threshold: float) -> int | None:
    """Index of the candidate most similar to ``question`` if it reaches ``threshold`` (first on ties), else None."""
    scored = [(question_similarity(question, candidate), -i) for i, candidate in enumerate(candidates)]
    if not scored:
        return None
    similarity, negative_index = max(scored)
    return -negative_index if similarity >= threshold else None


def is_refusal(reply: str) -> bool:
    lowered = reply.lower().replace("’", "'")
    return any(phrase in lowered for phrase in _REFUSALS)


_YES = ("yes", "yeah", "yep", "i do", "i have", "i am", "i did", "it is", "it does", "there is", "it has")
_NO = ("no", "nope", "never", "not", "i don't", "i didn't", "i haven't", "i'm not", "it isn't", "it doesn't", "it's not",
       "there isn't", "i do not", "i did not", "i have not")
_NEGATION = re.compile(r"\b(no|not|never|none|nothing)\b|n't\b")


def polarity(reply: str) -> str | None:
    """``"yes"`` or ``"no"`` for a reply that opens with one (a yes/no finding), else None (a refusal
    too). An affirmative opening whose first clause is negated ("It does not hurt", "I have no
    fever") is a no."""
    if is_refusal(reply):
        return None
    lowered = reply.lower().replace("’", "'")
    clause = re.split(r"[,.;!?]", lowered, maxsplit=1)[0]
    words = " ".join(re.sub(r"[^a-z' ]", " ", clause).split())
    if any(words == opening or words.startswith(opening + " ") for opening in _NO):
        return "no"
    if any(words == opening or words.startswith(opening + " ") for opening in _YES):
        return "no" if _NEGATION.search(words) else "yes"
    return None


@dataclass(frozen=True)
class PatientReply:
    text: str
    truncated: bool = False
    empty: bool = False


class RulePatient:
    """Answers from the case's question–answer pairs (module docstring)."""

    def __init__(self, qa: Sequence[QA], threshold: float) -> None:
        self.qa, self.threshold = tuple(qa), threshold

    def reply(self, question: str) -> PatientReply:
        match = best_match(question, [pair.question for pair in self.qa], self.threshold)
        return PatientReply(DONT_KNOW if match is None else self.qa[match].answer)


def clean_reply(text: str, finish_reason: str, max_chars: int) -> PatientReply:
    """An Env-LLM reply as the doctor sees it (module docstring)."""
    text = " ".join(text.split())
    if not text:
        return PatientReply(DONT_KNOW, empty=True)
    if len(text) <= max_chars and finish_reason != "length":
        return PatientReply(text)
    cut = text[:max_chars]
    ends = [m.end() for m in re.finditer(r"[.!?](\s|$)", cut)]
    return PatientReply((cut[: ends[-1]] if ends else cut).strip(), truncated=True)
