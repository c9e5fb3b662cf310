"""The doctor agent's world: consultation cases, the environment, the patients that answer, and the
probe of an LLM patient before RL against it."""

from posttrain.agents.doctor.case import QA, Case, CaseError, case_from_sample
from posttrain.agents.doctor.env import DoctorEnv
from posttrain.agents.doctor.patient import PatientReply, RulePatient, clean_reply, question_similarity
from posttrain.agents.doctor.probe import UnfaithfulPatient, patient_faithfulness
from posttrain.agents.doctor.prompts import DONT_KNOW, doctor_instruction, patient_messages

__all__ = [
    "DONT_KNOW", "QA", "Case", "CaseError", "DoctorEnv", "PatientReply", "RulePatient", "UnfaithfulPatient", "case_from_sample",
    "clean_reply", "doctor_instruction", "patient_faithfulness", "patient_messages", "question_similarity",
]
