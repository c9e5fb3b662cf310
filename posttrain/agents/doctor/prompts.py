"""The words both sides of a consultation are given: the doctor's instruction and the patient's prompt.

Actions are tags a 135M model can learn: ``<question>...</question>`` asks the patient,
``<diagnosis>...</diagnosis>`` ends the consultation. No placeholder words inside the tags (a small
model copies ``<question> your question </question>`` literally).
"""

from __future__ import annotations

from collections.abc import Sequence

QUESTION_TAG, DIAGNOSIS_TAG = "question", "diagnosis"
DONT_KNOW = "I don't know."


def doctor_instruction(self_report: str) -> str:
    """The doctor's prompt: the patient's self-report and how to act."""
    return (
        "You are a doctor in a consultation. The patient says:\n"
        f"\"{self_report}\"\n"
        f"Ask the patient one question at a time, written between <{QUESTION_TAG}> and </{QUESTION_TAG}>. "
        f"When you know the cause, give your diagnosis between <{DIAGNOSIS_TAG}> and </{DIAGNOSIS_TAG}>."
    )


def how_to_act() -> str:
    """The corrective text after a turn that is neither a question nor a diagnosis."""
    return (f"Ask one question between <{QUESTION_TAG}> and </{QUESTION_TAG}>, "
            f"or give your diagnosis between <{DIAGNOSIS_TAG}> and </{DIAGNOSIS_TAG}>.")


def patient_messages(description: str, dialogue: Sequence[tuple[str, str]], question: str) -> list[dict[str, str]]:
    """The env-LLM's chat prompt for the patient's next reply.

    ``dialogue``: the earlier (question, reply) pairs of this consultation. The doctor speaks as
    ``user`` and the patient as ``assistant``, so the model answers in the patient's voice.
    """
    system = (
        "You are a patient talking to a doctor. Your case:\n"
        f"{description}\n"
        "Answer the doctor's question as the patient, in one or two short sentences. Say only what your case "
        f"supports. If your case does not say, answer \"{DONT_KNOW}\""
    )
    messages = [{"role": "system", "content": system}]
    for asked, replied in dialogue:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": replied}]
    return messages + [{"role": "user", "content": question}]


def judge_messages(predicted: str, diagnoses: Sequence[str]) -> list[dict[str, str]]:
    """The env-LLM's prompt when it judges a diagnosis (``judge="llm"``): it must answer yes or no."""
    names = " / ".join(diagnoses)
    return [{
        "role": "user",
        "content": (f"A doctor diagnosed: \"{predicted}\". The correct diagnosis is: \"{names}\". "
                    "Do they name the same condition? Answer only yes or no."),
    }]
