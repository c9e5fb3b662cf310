"""The medical-consultation environment: a doctor interviews a simulated patient, then diagnoses.

This is DoctorAgent-RL's setting (Feng et al., 2025, "DoctorAgent-RL: A Multi-Agent Collaborative
Reinforcement Learning System for Multi-Turn Clinical Dialogue") behind the
:class:`~posttrain.agents.env.Environment` interface. The doctor's prompt holds the patient's
self-report (:func:`~posttrain.agents.doctor.prompts.doctor_instruction`); a turn ends on
``</question>`` or ``</diagnosis>`` and its action is the FIRST complete block of either tag.

- **Question.** The patient answers and the episode goes on. The patient is the Env-LLM
  (``patient="llm"``: the hidden description, the dialogue so far and the question, one batched
  request per round for all live episodes) or the rule-based patient (``patient="rule"``, answers
  from the case's question–answer pairs). The observation is ``Patient: <reply>``, followed by
  ``(You can ask N more questions.)`` when ``announce_turns_left``.
- **Diagnosis.** The episode ends. It is correct when it equals the diagnosis or an alias after
  normalisation (lower case, punctuation and articles removed: :func:`~posttrain.agents.search.exact_match`),
  or, with ``judge="llm"``, when it does not but the Env-LLM says yes to "do they name the same
  condition?" (a judge that fails leaves it wrong, counted as ``judge_errors``). With ``judge="rubric"`` the
  environment does not judge: the diagnosis (the text inside the tags) goes to the reward path as the
  episode's answer, scored by the run's ``reward.rubric`` (the same check as a rubric part: the
  ``synthetic_doctor`` rule, then a judge question; docs/rewards.md) or else by that rule alone; its score
  is the diagnosis turn's reward beside the turn's cost, so ``correct_reward`` stays 1.
- **Anything else** is invalid: a corrective observation and ``invalid_action_penalty``.

Rewards (the seed's shaping; each is an option, a penalty is a reward ``<= 0``), per step:
``turn_penalty`` every turn; ``correct_reward`` for a correct diagnosis; ``relevant_question_reward``
for a question matching a case question not matched before (``similarity_threshold``, see
``patient.py``) that repeats no earlier question; ``irrelevant_question_penalty`` for a question matching
none, or repeating an earlier question or an already-matched case question; nothing more for running
out of turns without a diagnosis (the forced final turn must diagnose; anything else, an empty
diagnosis too, ends the episode with the turn's cost only).

Patient failures never raise: an empty reply becomes "I don't know." (``patient_empty``), an overlong
one is cut (``patient_truncated``), and a reply the Env-LLM could not give (its client's retries
spent, ``agents/env_llm.py``) ends the episode with the turn's cost and ``patient_errors`` counted.

Counters: see :attr:`DoctorEnv.counters`; ``env/relevant_question_ratio`` is relevant over all questions.
The patient's contract, in every run and validation: ``env/patient_faithfulness`` is the share of
questions matching a yes/no finding of the case whose reply agrees with it (``patient_checked``,
``patient_agreed``), beside ``patient_refusals`` and ``patient_leaks`` (a reply naming the diagnosis).
Before RL against an LLM patient, :meth:`DoctorEnv.before_training` probes that share and refuses a
patient below ``env.llm.min_faithfulness`` (``probe.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from posttrain.agents.doctor.case import Case, case_from_sample
from posttrain.agents.doctor.patient import PatientReply, RulePatient, best_match, clean_reply, is_refusal, polarity, question_similarity
from posttrain.agents.doctor.probe import probe_patient, probe_wanted
from posttrain.agents.doctor.prompts import DIAGNOSIS_TAG, QUESTION_TAG, how_to_act, judge_messages, patient_messages
from posttrain.agents.env import EpisodeAnswer, EpisodeSample, Environment, StepInfo, StepResult
from posttrain.agents.env_llm import EnvLLM, EnvLLMError, EnvLLMReply
from posttrain.agents.search import exact_match
from posttrain.errors import InputError

if TYPE_CHECKING:
    from posttrain.config.schema import EnvConfig

_ACTION = re.compile(rf"<({QUESTION_TAG}|{DIAGNOSIS_TAG})>(.*?)</\1>", re.DOTALL)
PATIENTS, JUDGES = ("llm", "rule"), ("rule", "llm", "rubric")


@dataclass(frozen=True)
class _Ask:
    """A parsed question waiting for the patient's reply."""

    question: str
    counts: dict[str, float]
    reward: float
    finding: int | None = None  # the case question it matches best (for the patient's faithfulness)


@dataclass(frozen=True)
class _Diagnose:
    """A parsed diagnosis waiting for the judge (``judge="llm"`` only)."""

    diagnosis: str


class DoctorEnv(Environment):
    """One consultation; see the module docstring for the rules."""

    name: ClassVar[str] = "doctor"
    counters: ClassVar[tuple[str, ...]] = (
        "questions", "relevant_questions", "irrelevant_questions", "repeated_questions", "diagnoses", "correct_diagnoses",
        "invalid", "patient_refusals", "patient_truncated", "patient_empty", "patient_errors", "judge_errors",
        "patient_checked", "patient_agreed", "patient_leaks",
    )
    ratios: ClassVar[Mapping[str, tuple[str, str]]] = {
        "relevant_question_ratio": ("relevant_questions", "questions"),
        "patient_faithfulness": ("patient_agreed", "patient_checked"),  # the patient's yes/no agrees with the case's
    }

    def __init__(
        self,
        env_llm: EnvLLM | None = None,
        *,
        patient: str = "llm",
        judge: str = "rule",
        correct_reward: float = 1.0,
        relevant_question_reward: float = 0.1,
        irrelevant_question_penalty: float = -0.05,
        turn_penalty: float = -0.01,
        invalid_action_penalty: float = -0.05,
        similarity_threshold: float = 0.5,
        announce_turns_left: bool = False,
        max_question_chars: int = 300,
        max_reply_chars: int = 300,
    ) -> None:
        _check_options(patient, judge, correct_reward, relevant_question_reward, (irrelevant_question_penalty, turn_penalty,
                       invalid_action_penalty), similarity_threshold, max_question_chars, max_reply_chars)
        if env_llm is None and "llm" in (patient, judge):
            raise InputError(f"DoctorEnv(patient={patient!r}, judge={judge!r}) needs the env_llm resource (an Env-LLM); "
                             "the trainer gives it when env.llm is configured, or use patient=rule judge=rule")
        self.env_llm = env_llm
        self.patient, self.judge = patient, judge
        self.correct_reward, self.relevant_question_reward = correct_reward, relevant_question_reward
        self.irrelevant_question_penalty, self.turn_penalty = irrelevant_question_penalty, turn_penalty
        self.invalid_action_penalty, self.similarity_threshold = invalid_action_penalty, similarity_threshold
        self.announce_turns_left = announce_turns_left
        self.max_question_chars, self.max_reply_chars = max_question_chars, max_reply_chars
        self.case: Case | None = None
        self.dialogue: list[tuple[str, str]] = []
        self.asked: list[str] = []
        self.matched: set[int] = set()
        self.turns = 0

    @classmethod
    def needed_resources(cls, options: Mapping[str, Any]) -> set[str]:
        """The Env-LLM only when it plays the patient or judges."""
        uses_llm = "llm" in (options.get("patient", "llm"), options.get("judge", "rule"))
        return {"env_llm"} if uses_llm else set()

    @classmethod
    def before_training(cls, env: EnvConfig, resources: Mapping[str, Any], samples: Iterable[EpisodeSample]) -> None:
        """The patient probe (``probe.py``) for an LLM patient with ``env.llm.min_faithfulness`` set."""
        if probe_wanted(env):
            probe_patient(env, resources["env_llm"], samples)

    @classmethod
    def check_sample(cls, sample: EpisodeSample, options: Mapping[str, Any]) -> None:
        case_from_sample(sample)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (f"</{QUESTION_TAG}>", f"</{DIAGNOSIS_TAG}>")

    def reset(self, sample: EpisodeSample) -> str:
        self.case = case_from_sample(sample)
        self.dialogue, self.asked, self.matched, self.turns = [], [], set(), 0
        return ""

    def final_turn_instruction(self) -> str:
        return f"You can ask no more questions. Give your diagnosis now between <{DIAGNOSIS_TAG}> and </{DIAGNOSIS_TAG}>."

    def step(self, action: str) -> StepResult:
        return type(self).step_batch([self], [action])[0]

    def finish(self, action: str) -> StepResult:
        """The forced final turn: a diagnosis is scored; anything else ends the episode with the turn's cost only."""
        parsed = _parse(action)
        if parsed is not None and parsed[0] == DIAGNOSIS_TAG and parsed[1]:
            return self.step(action)
        self.turns += 1
        return StepResult("", self.turn_penalty, True, StepInfo(valid=False, effective=False, counts={"invalid": 1}))

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        """Step every episode; the Env-LLM gets ONE ``chat`` call for all patient replies and judgements."""
        doctors = [_as_doctor(env) for env in envs]
        plans = [doctor._plan(action) for doctor, action in zip(doctors, actions, strict=True)]
        requests = [(i, doctor._request(plans[i])) for i, doctor in enumerate(doctors) if doctor._uses_llm(plans[i])]
        replies: dict[int, EnvLLMReply] = {}
        by_llm: dict[int, list[int]] = {}
        for position, (i, _) in enumerate(requests):
            by_llm.setdefault(id(doctors[i].env_llm), []).append(position)
        for positions in by_llm.values():
            llm = doctors[requests[positions[0]][0]].env_llm
            try:
                answered = llm.chat([requests[p][1] for p in positions])
            except EnvLLMError as error:  # a backend that fails the whole batch: every conversation failed
                answered = [EnvLLMReply("", "error", error=str(error))] * len(positions)
            replies.update({requests[p][0]: reply for p, reply in zip(positions, answered)})
        return [plan if isinstance(plan, StepResult) else doctors[i]._resolve(plan, replies.get(i))
                for i, plan in enumerate(plans)]

    # ---- one step in three parts: plan (parse), request (the Env-LLM's prompt), resolve ----------

    def _plan(self, action: str) -> StepResult | _Ask | _Diagnose:
        if self.case is None:
            raise RuntimeError("DoctorEnv.step before reset: call reset(sample) to give the episode its case")
        self.turns += 1
        parsed = _parse(action)
        if parsed is None or not parsed[1]:
            observation = f"Your previous action is invalid. {how_to_act()}"
            return StepResult(observation, self.turn_penalty + self.invalid_action_penalty, False,
                              StepInfo(valid=False, effective=False, counts={"invalid": 1}))
        tag, content = parsed
        if tag == DIAGNOSIS_TAG:
            if self.judge == "rubric":  # the reward path scores it (module docstring); success is its verdict
                return StepResult("", self.turn_penalty, True, StepInfo(valid=True, effective=True, counts={"diagnoses": 1.0}),
                                  answer=EpisodeAnswer(content))
            # the judge is asked only about a diagnosis the rule does not already accept
            if self.judge == "rule" or exact_match(content, list(self.case.diagnoses)):
                return self._diagnosis_result(content, None)
            return _Diagnose(content)
        return self._ask(content[: self.max_question_chars].strip())

    def _ask(self, question: str) -> _Ask:
        """Score a question against the case's questions not matched yet and the ones asked before."""
        repeated = any(question_similarity(question, earlier) >= self.similarity_threshold for earlier in self.asked)
        unmatched = [i for i in range(len(self.case.qa)) if i not in self.matched]
        match = best_match(question, [self.case.qa[i].question for i in unmatched], self.similarity_threshold)
        self.asked.append(question)
        counts = {"questions": 1.0}
        finding = best_match(question, [pair.question for pair in self.case.qa], self.similarity_threshold)
        if match is not None and not repeated:
            self.matched.add(unmatched[match])
            counts["relevant_questions"] = 1.0
            return _Ask(question, counts, self.turn_penalty + self.relevant_question_reward, unmatched[match])
        counts["repeated_questions" if repeated or finding is not None else "irrelevant_questions"] = 1.0
        return _Ask(question, counts, self.turn_penalty + self.irrelevant_question_penalty, finding)

    def _uses_llm(self, plan: StepResult | _Ask | _Diagnose) -> bool:
        return isinstance(plan, _Diagnose) or (isinstance(plan, _Ask) and self.patient == "llm")

    def _request(self, plan: _Ask | _Diagnose) -> list[dict[str, str]]:
        if isinstance(plan, _Diagnose):
            return judge_messages(plan.diagnosis, self.case.diagnoses)
        return patient_messages(self.case.description, self.dialogue, plan.question)

    def _resolve(self, plan: _Ask | _Diagnose, reply: EnvLLMReply | None) -> StepResult:
        """The step's result once the Env-LLM answered (``reply``; None for the rule patient)."""
        failed = reply is not None and reply.failed
        if isinstance(plan, _Diagnose):  # a judge that failed leaves the rule's verdict (not the same name: wrong)
            result = self._diagnosis_result(plan.diagnosis, not failed and reply.text.strip().lower().startswith("yes"))
            return StepResult(result.observation, result.reward, True, StepInfo(
                valid=True, effective=True, success=result.info.success,
                counts={**result.info.counts, **({"judge_errors": 1.0} if failed else {})}))
        if failed:  # no reply: the consultation cannot go on; the question's own reward is not paid
            return StepResult("", self.turn_penalty, True,
                              StepInfo(valid=True, effective=False, counts={"questions": 1.0, "patient_errors": 1.0}))
        if reply is None:
            answer = RulePatient(self.case.qa, self.similarity_threshold).reply(plan.question)
        else:
            answer = clean_reply(reply.text, reply.finish_reason, self.max_reply_chars)
        return self._answer_result(plan, answer)

    def _answer_result(self, plan: _Ask, answer: PatientReply) -> StepResult:
        self.dialogue.append((plan.question, answer.text))
        counts = dict(plan.counts)
        for name, happened in (("patient_refusals", is_refusal(answer.text)), ("patient_truncated", answer.truncated),
                               ("patient_empty", answer.empty), ("patient_leaks", self._names_the_diagnosis(answer.text))):
            if happened:
                counts[name] = 1.0
        expected = polarity(self.case.qa[plan.finding].answer) if plan.finding is not None else None
        if expected is not None:  # a yes/no finding: does the patient's reply agree with the case?
            counts["patient_checked"] = 1.0
            if polarity(answer.text) == expected:
                counts["patient_agreed"] = 1.0
        observation = f"Patient: {answer.text}"
        if self.announce_turns_left and self.turn_budget is not None:
            observation += f"\n(You can ask {max(self.turn_budget - self.turns, 0)} more questions.)"
        return StepResult(observation, plan.reward, False, StepInfo(valid=True, effective=True, counts=counts))

    def _names_the_diagnosis(self, reply: str) -> bool:
        """The patient gave the answer away: a diagnosis or alias appears in the reply, as whole words."""
        words = f" {' '.join(re.sub(r'[^a-z0-9 ]', ' ', reply.lower()).split())} "
        return any(f" {' '.join(re.sub(r'[^a-z0-9 ]', ' ', name.lower()).split())} " in words for name in self.case.diagnoses)

    def _diagnosis_result(self, diagnosis: str, judged_same: bool | None) -> StepResult:
        correct = exact_match(diagnosis, list(self.case.diagnoses)) or bool(judged_same)
        counts = {"diagnoses": 1.0, **({"correct_diagnoses": 1.0} if correct else {})}
        reward = self.turn_penalty + (self.correct_reward if correct else 0.0)
        return StepResult("", reward, True, StepInfo(valid=True, effective=True, success=correct, counts=counts))


def _parse(action: str) -> tuple[str, str] | None:
    found = _ACTION.search(action)
    return None if found is None else (found.group(1), found.group(2).strip())


def _as_doctor(env: Environment) -> DoctorEnv:
    if not isinstance(env, DoctorEnv):
        raise TypeError(f"DoctorEnv.step_batch got a {type(env).__name__}; step each environment class with its own step_batch")
    return env


def _check_options(patient: str, judge: str, correct: float, relevant: float, penalties: tuple[float, ...],
                   threshold: float, max_question_chars: int, max_reply_chars: int) -> None:
    problems = []
    if patient not in PATIENTS:
        problems.append(f"patient={patient!r} must be one of {PATIENTS}")
    if judge not in JUDGES:
        problems.append(f"judge={judge!r} must be one of {JUDGES}")
    if judge == "rubric" and correct != 1.0:
        problems.append(f"correct_reward={correct}: with judge=rubric the reward path's score (in [0, 1]) is the diagnosis's reward; "
                        "weigh it in reward.rubric instead, and leave correct_reward at 1")
    if correct <= 0 or relevant < 0:
        problems.append(f"correct_reward={correct} must be > 0 and relevant_question_reward={relevant} >= 0")
    if any(p > 0 for p in penalties):
        problems.append(f"the penalties {penalties} (irrelevant_question_penalty, turn_penalty, invalid_action_penalty) "
                        "are rewards added per turn, so each must be <= 0 (e.g. -0.05)")
    if not 0 < threshold <= 1:
        problems.append(f"similarity_threshold={threshold} must lie in (0, 1]")
    if max_question_chars < 1 or max_reply_chars < 1:
        problems.append(f"max_question_chars={max_question_chars} and max_reply_chars={max_reply_chars} must be >= 1")
    if problems:
        raise InputError("DoctorEnv options: " + "; ".join(problems))

