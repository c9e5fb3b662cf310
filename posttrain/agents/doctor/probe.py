"""The patient probe: before RL against an LLM patient (``patient: llm``), is the patient faithful to
its cases?

Each of up to 64 yes/no findings of the held-out cases (the training cases when there are none) is
asked as a fresh first question (:func:`patient_faithfulness`). A patient
agreeing on less than ``env.llm.min_faithfulness`` stops the run before its first step, with the
command that trains a faithful one; ``env.llm.min_faithfulness=null`` skips the probe. When no finding
was answered at all (every reply failed: a service problem, not an unfaithful patient) nothing is
refused; the run's Env-LLM breaker (``env.llm.stop_at_failed_fraction``) judges a patient that does
not answer. Run by :meth:`DoctorEnv.before_training <posttrain.agents.env.Environment.before_training>`,
which the trainer calls once when a run starts, never on a resume (the run was probed when it started).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING

from posttrain.agents.doctor.case import case_from_sample
from posttrain.agents.doctor.patient import clean_reply, polarity
from posttrain.agents.doctor.prompts import patient_messages
from posttrain.agents.env import EpisodeSample
from posttrain.agents.env_llm import EnvLLM, EnvLLMClient
from posttrain.errors import PosttrainError

if TYPE_CHECKING:
    from posttrain.config.schema import EnvConfig

PROBE_CASES = 64  # the cases read for findings (patient_faithfulness asks at most 64 findings of them)


class UnfaithfulPatient(PosttrainError):
    """The doctor's LLM patient contradicts its cases too often for RL against it to mean anything."""

    exit_code = 2


def probe_wanted(env: EnvConfig) -> bool:
    """An LLM patient (``env.options.patient``, default llm) with a bar to clear (``env.llm.min_faithfulness``)."""
    return env.options.get("patient", "llm") == "llm" and env.llm.min_faithfulness is not None


def probe_patient(env: EnvConfig, env_llm: EnvLLMClient, samples: Iterable[EpisodeSample]) -> None:
    """Ask the patient, print its agreement, and raise :class:`UnfaithfulPatient` below the bar."""
    llm = env.llm
    faithfulness, asked = patient_faithfulness(env_llm, list(islice(samples, PROBE_CASES)))
    env_llm.drain_metrics()  # the probe's requests are not the first step's
    print(f"posttrain: the patient ({llm.url or llm.model_path}) agrees with its cases on {faithfulness:.2f} of {asked} yes/no "
          f"findings it answered (env.llm.min_faithfulness={llm.min_faithfulness:g})")
    if asked and faithfulness < llm.min_faithfulness:
        raise UnfaithfulPatient(
            f"the patient ({llm.url or llm.model_path}) agrees with its cases on {faithfulness:.2f} of {asked} yes/no findings, "
            f"below env.llm.min_faithfulness={llm.min_faithfulness:g}: its answers carry too little for the doctor to learn "
            "from. Train a faithful patient first: `posttrain recipe doctor` does (or, by hand, `posttrain prepare "
            "synthetic-doctor --out data/doctor-patient patient_sft_size=1536` then `posttrain sft "
            "sft.train_files=[data/doctor-patient/patient_sft.parquet] sft.val_rollout=false sft.train_batch_size=16 "
            "sft.total_epochs=1 sft.max_length=512 trainer.experiment_name=doctor_patient_sft` and "
            "env.llm.model_path=runs/posttrain/doctor_patient_sft/export); or set env.llm.min_faithfulness=null to train anyway"
        )


def patient_faithfulness(env_llm: EnvLLM, samples: Sequence[EpisodeSample], max_questions: int = 64,
                         max_reply_chars: int = 300) -> tuple[float, int]:
    """How often the patient's answer agrees with its case on a yes/no finding, each finding asked
    as the first question of a fresh consultation (one batched request); returns (agreement, answered).
    A failed reply (no answer at all: a service problem, not an unfaithful patient) is left out.
    (0.0, 0) when nothing was answered."""
    conversations, expected = [], []
    for sample in samples:
        case = case_from_sample(sample)
        for pair in case.qa:
            want = polarity(pair.answer)
            if want is not None and len(expected) < max_questions:
                conversations.append(patient_messages(case.description, [], pair.question))
                expected.append(want)
    if not expected:
        return 0.0, 0
    answered = [(reply, want) for reply, want in zip(env_llm.chat(conversations), expected) if not reply.failed]
    if not answered:
        return 0.0, 0
    agreed = sum(polarity(clean_reply(reply.text, reply.finish_reason, max_reply_chars).text) == want for reply, want in answered)
    return agreed / len(answered), len(answered)
