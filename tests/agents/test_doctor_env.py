"""The doctor environment: every reward term by hand, the two patients, matching, budgets, bad input."""

import pytest

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, TurnOutput, episode_metrics, run_episodes
from posttrain.agents.doctor import DONT_KNOW, QA, Case, CaseError, DoctorEnv, case_from_sample, doctor_instruction, question_similarity
from posttrain.agents.doctor.patient import clean_reply
from posttrain.agents.env_llm import EnvLLMError, EnvLLMReply
from posttrain.rollout.environments import load_env_class, wanted_resources

CASE = Case(
    "case-7", "I've had chest pain for three days.",
    "I am a 45-year-old man. My chest pain gets worse when I breathe in deeply. I have no fever.",
    "pericarditis", ("acute pericarditis",),
    (QA("Does the pain get worse when you breathe in deeply?", "Yes, it hurts more when I take a deep breath."),
     QA("Do you have a fever?", "No, I have no fever."),
     QA("Does the pain spread to your left arm?", "No, it stays in my chest.")),
)


def sample(case: Case = CASE) -> EpisodeSample:
    return EpisodeSample([{"role": "user", "content": doctor_instruction(case.self_report)}], case.ground_truth(),
                         "synthetic_doctor", case.extra_info())


def rule_env(**options) -> DoctorEnv:
    env = DoctorEnv(patient="rule", **options)
    env.reset(sample())
    return env


class FakeLLM:
    """Answers every conversation with the next scripted reply (or raises); records the calls."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def chat(self, conversations):
        self.calls.append([list(c) for c in conversations])
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, list):  # one scripted reply per conversation
            return reply
        return [reply if isinstance(reply, EnvLLMReply) else EnvLLMReply(reply, "stop") for _ in conversations]


def test_the_case_travels_in_a_row_and_comes_back_equal():
    assert case_from_sample(sample()) == CASE


@pytest.mark.parametrize("field, message", [("self_report", "no self-report"), ("target", "no diagnosis")])
def test_a_case_without_a_diagnosis_or_self_report_is_refused_naming_it(field, message):
    broken = sample()
    extra, truth = dict(broken.extra_info), dict(broken.ground_truth)
    if field == "self_report":
        extra["self_report"] = ""
    else:
        truth["target"] = []
    with pytest.raises(CaseError, match=f"case 'case-7' has {message}"):
        DoctorEnv.check_sample(EpisodeSample(broken.prompt, truth, broken.data_source, extra), {})


def test_rewards_by_hand_with_the_rule_patient():
    env = rule_env()  # turn -0.01, relevant +0.1, irrelevant/repeated -0.05, invalid -0.05, correct +1
    relevant = env.step("Let me ask. <question> Does the pain get worse when you breathe in deeply? </question>")
    assert relevant.observation == "Patient: Yes, it hurts more when I take a deep breath."
    assert relevant.reward == pytest.approx(0.09) and not relevant.done
    faithful = {"patient_checked": 1, "patient_agreed": 1}  # a yes/no finding, answered as the case says
    assert relevant.info.counts == {"questions": 1, "relevant_questions": 1} | faithful
    repeated = env.step("<question>Does the pain get worse when you breathe in deeply?</question>")
    assert repeated.reward == pytest.approx(-0.06) and repeated.info.counts == {"questions": 1, "repeated_questions": 1} | faithful
    irrelevant = env.step("<question>Do you smoke?</question>")
    assert irrelevant.observation == f"Patient: {DONT_KNOW}"
    assert irrelevant.reward == pytest.approx(-0.06)
    assert irrelevant.info.counts == {"questions": 1, "irrelevant_questions": 1, "patient_refusals": 1}
    invalid = env.step("I think it is the heart.")
    assert not invalid.info.valid and invalid.reward == pytest.approx(-0.06) and "<question>" in invalid.observation
    diagnosis = env.step("<diagnosis> Acute Pericarditis. </diagnosis>")  # an alias, normalised
    assert diagnosis.done and diagnosis.info.success and diagnosis.reward == pytest.approx(0.99)
    assert diagnosis.info.counts == {"diagnoses": 1, "correct_diagnoses": 1}


def test_a_wrong_diagnosis_earns_only_the_turn_cost_and_rewards_are_configurable():
    env = rule_env(turn_penalty=0.0, correct_reward=2.0, relevant_question_reward=0.5, irrelevant_question_penalty=-0.25)
    assert env.step("<question>Do you have a fever?</question>").reward == 0.5
    assert env.step("<question>Where do you live?</question>").reward == -0.25
    wrong = env.step("<diagnosis>angina</diagnosis>")
    assert wrong.done and not wrong.info.success and wrong.reward == 0.0


def test_matching_is_word_overlap_with_a_threshold():
    assert question_similarity("Do you have a fever?", "Have you had any fever?") == 1.0
    assert question_similarity("Do you have a fever?", "Does the pain spread to your left arm?") == 0.0
    # a rephrasing that shares half its content words matches at the default threshold 0.5
    assert question_similarity("Does the pain spread to the arm?", "Does the pain spread to your left arm?") == 0.75
    strict = rule_env(similarity_threshold=0.9)
    assert strict.step("<question>Does the pain spread to the arm?</question>").info.counts["irrelevant_questions"] == 1
    loose = rule_env()
    assert loose.step("<question>Does the pain spread to the arm?</question>").observation == "Patient: No, it stays in my chest."


def test_the_forced_final_turn_must_diagnose():
    env = rule_env()
    asked = env.finish("<question>Do you have a fever?</question>")
    assert asked.done and asked.reward == pytest.approx(-0.01) and not asked.info.valid
    env = rule_env()
    assert env.finish("<diagnosis>pericarditis</diagnosis>").info.success


def test_the_llm_patient_gets_one_batched_request_per_round_with_the_dialogue_so_far():
    llm = FakeLLM(["Yes, when I breathe in.", "No fever."])
    envs = [DoctorEnv(llm, patient="llm") for _ in range(3)]
    for env in envs:
        env.reset(sample())
    first = DoctorEnv.step_batch(envs, ["<question>Does the pain get worse when you breathe in deeply?</question>",
                                        "<question>Do you have a fever?</question>", "<diagnosis>angina</diagnosis>"])
    assert len(llm.calls) == 1 and len(llm.calls[0]) == 2  # two questions, one call; the diagnosis needs no model
    assert [r.observation for r in first[:2]] == ["Patient: Yes, when I breathe in."] * 2 and first[2].done
    conversation = llm.calls[0][0]
    assert conversation[0]["role"] == "system" and CASE.description in conversation[0]["content"]
    assert conversation[-1] == {"role": "user", "content": "Does the pain get worse when you breathe in deeply?"}
    DoctorEnv.step_batch(envs[:1], ["<question>Do you have a fever?</question>"])
    later = llm.calls[1][0]
    assert later[1:] == [
        {"role": "user", "content": "Does the pain get worse when you breathe in deeply?"},
        {"role": "assistant", "content": "Yes, when I breathe in."},
        {"role": "user", "content": "Do you have a fever?"},
    ]


def test_empty_overlong_and_failed_patient_replies():
    llm = FakeLLM(["   ", EnvLLMReply("I have pain. It is bad. " * 10, "length"), EnvLLMError("worker gone")])
    env = DoctorEnv(llm, patient="llm", max_reply_chars=40)
    env.reset(sample())
    empty = env.step("<question>Do you have a fever?</question>")
    assert empty.observation == f"Patient: {DONT_KNOW}" and empty.info.counts["patient_empty"] == 1
    long = env.step("<question>Does the pain spread to your left arm?</question>")
    assert long.observation == "Patient: I have pain. It is bad. I have pain."
    assert long.info.counts["patient_truncated"] == 1
    failed = env.step("<question>Does the pain get worse when you breathe in deeply?</question>")
    assert failed.done and failed.info.counts["patient_errors"] == 1 and failed.reward == pytest.approx(-0.01)


def test_a_failed_reply_ends_only_its_own_episode():
    llm = FakeLLM([[EnvLLMReply("", "error", error="HTTP 400"), EnvLLMReply("No fever.", "stop")]])
    envs = [DoctorEnv(llm, patient="llm") for _ in range(2)]
    for env in envs:
        env.reset(sample())
    failed, answered = DoctorEnv.step_batch(envs, ["<question>Do you have a fever?</question>"] * 2)
    assert failed.done and failed.info.counts == {"questions": 1, "patient_errors": 1} and failed.reward == pytest.approx(-0.01)
    assert not answered.done and answered.observation == "Patient: No fever."


def test_a_new_relevant_question_is_rewarded_even_when_it_resembles_a_matched_one():
    qa = (QA("Is the pain sharp?", "Yes."), QA("Is the pain sharp and burning?", "No."))
    env = DoctorEnv(patient="rule")
    env.reset(sample(Case("c", "Pain.", "Pain.", "x", (), qa)))
    assert env.step("<question>Is the pain sharp?</question>").info.counts["relevant_questions"] == 1
    # its best match is the matched question, but the unmatched one also reaches the threshold
    second = env.step("<question>Is the pain sharp, burning?</question>")
    assert questions_only(second.info.counts) == {"questions": 1, "repeated_questions": 1}  # it repeats the first question's words
    env.reset(sample(Case("c", "Pain.", "Pain.", "x", (), qa)))
    env.step("<question>Is the pain sharp and burning?</question>")
    assert questions_only(env.step("<question>Is it sharp?</question>").info.counts) == {"questions": 1, "relevant_questions": 1}


def questions_only(counts):
    """The question counters, without the patient's (faithfulness, refusals)."""
    return {name: value for name, value in counts.items() if not name.startswith("patient_")}


def test_an_empty_diagnosis_in_the_final_turn_ends_the_episode():
    result = rule_env().finish("<diagnosis> </diagnosis>")
    assert result.done and result.reward == pytest.approx(-0.01) and not result.info.success


def test_clean_reply_cuts_after_the_last_whole_sentence():
    assert clean_reply("Yes. It hurts a lot when I move", "stop", 12).text == "Yes."
    assert clean_reply("No", "stop", 12) == clean_reply(" No ", "stop", 12)


def test_the_llm_judge_accepts_what_the_model_calls_the_same():
    llm = FakeLLM(["Yes, they are the same.", "no", [EnvLLMReply("", "error", error="down")]])
    env = DoctorEnv(llm, patient="rule", judge="llm")
    env.reset(sample())
    assert env.step("<diagnosis>inflammation of the pericardium</diagnosis>").info.success
    assert "pericarditis" in llm.calls[0][0][0]["content"]
    env.reset(sample())
    assert not env.step("<diagnosis>heart attack</diagnosis>").info.success
    env.reset(sample())
    assert env.step("<diagnosis>pericarditis</diagnosis>").info.success and len(llm.calls) == 2  # exact: no judge asked
    env.reset(sample())
    judged = env.step("<diagnosis>pericardial inflammation</diagnosis>")  # the judge fails: the rule's verdict stands
    assert judged.done and not judged.info.success and judged.info.counts["judge_errors"] == 1


def test_the_env_llm_is_a_resource_only_when_an_option_needs_it():
    doctor = load_env_class("doctor")
    assert wanted_resources(doctor, {"patient": "rule"}) == set()
    assert wanted_resources(doctor, {"patient": "llm"}) == {"env_llm"}
    assert wanted_resources(doctor, {"patient": "rule", "judge": "llm"}) == {"env_llm"}
    with pytest.raises(ValueError, match="needs the env_llm resource"):
        DoctorEnv(patient="llm")


@pytest.mark.parametrize("options, message", [
    ({"patient": "robot"}, "patient='robot'"), ({"turn_penalty": 0.1}, "must be <= 0"),
    ({"similarity_threshold": 0.0}, "similarity_threshold=0.0"), ({"correct_reward": 0}, "correct_reward=0"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        DoctorEnv(**({"patient": "rule"} | options))


def _scripted(actions_per_episode):
    """A GenerateTurn that replays fixed texts (one list per episode, in episode order) through the tokenizer."""

    def generate(tokenizer):
        def turn(contexts, max_new_tokens, stop, request_keys):
            outputs = []
            for context, key in zip(contexts, request_keys):
                index = int(key.rsplit(":", 1)[1])  # "<episode>:<turn>"
                episode = next(i for i, prompt in enumerate(prompts) if list(context[: len(prompt)]) == prompt)
                text = actions_per_episode[episode][index]
                ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                outputs.append(TurnOutput(ids, [0.0] * len(ids), "stop"))
            return outputs
        return turn

    prompts: list[list[int]] = []
    return generate, prompts


def test_budgets_fixed_and_drawn_with_turns_left_announced(tokenizer):
    asks = ["<question>Do you have a fever?</question>", "<question>Does the pain spread to your left arm?</question>",
            "<question>Does the pain get worse when you breathe in deeply?</question>", "<question>Do you smoke?</question>"]
    script = [asks + ["<question>Do you drink alcohol?</question>"]] * 6  # never a diagnosis
    make, prompts = _scripted(script)
    cases = [Case(f"c{i}", f"I've had chest pain for {i + 2} days.", CASE.description, CASE.diagnosis, CASE.aliases, CASE.qa)
             for i in range(6)]
    samples = [sample(case) for case in cases]
    prompts += [tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True, return_dict=False) for s in samples]
    renderer = ObservationRenderer(tokenizer, "user")
    for config, expected in ((AgentLoopConfig(max_response_length=800, max_turns=2, max_turn_tokens=48), [2] * 6),
                             (AgentLoopConfig(max_response_length=800, turns_range=(1, 4), max_turn_tokens=48, seed=3), None)):
        envs = [DoctorEnv(patient="rule", announce_turns_left=True) for _ in cases]
        episodes = run_episodes(envs, samples, [list(p) for p in prompts], make(tokenizer), renderer, config)
        budgets = [e.turn_budget for e in episodes]
        if expected is not None:
            assert budgets == expected
        else:
            assert all(1 <= b <= 4 for b in budgets) and len(set(budgets)) > 1
        for episode in episodes:
            # budget questions, then the forced final turn: the script's next action is a question, so no diagnosis
            assert episode.num_turns == episode.turn_budget + 1 and not episode.success
            assert "(You can ask 0 more questions.)" in episode.observations[-1]
            assert "Give your diagnosis now" in episode.observations[-1]
            if episode.turn_budget >= 2:
                assert "(You can ask 1 more questions.)" in episode.observations[-2]
        metrics = episode_metrics(episodes, None, DoctorEnv.counters, DoctorEnv.ratios)
        questions = sum(e.counts["questions"] for e in episodes)
        relevant = sum(e.counts.get("relevant_questions", 0) for e in episodes)
        assert metrics["env/relevant_question_ratio"].value == pytest.approx(relevant / questions)
        assert metrics["agent/success_rate"].value == 0.0


def test_the_patients_faithfulness_refusals_and_leaks_are_counted():
    """Each question matching a yes/no finding checks the patient's reply against the case: the
    rule patient always agrees; an LLM patient that contradicts the case, refuses, or names the
    diagnosis is counted (env/patient_faithfulness = agreed / checked)."""
    from posttrain.agents.doctor.patient import polarity

    replies = {"Yes, a lot.": "yes", "No fever.": "no", "Nope": "no", "I don't think so.": "no", "It does, yes.": "yes",
               "Maybe.": None, "I don't know.": None, "It does not hurt.": "no", "I have no fever.": "no",
               "I have never had that.": "no", "There is no rash.": "no", "I do have a cough.": "yes"}
    assert {reply: polarity(reply) for reply in replies} == replies
    llm = FakeLLM([[EnvLLMReply("No, not at all.", "stop")], [EnvLLMReply("I don't know.", "stop")],
                   [EnvLLMReply("My doctor said it is acute pericarditis.", "stop")]])
    env = DoctorEnv(llm, patient="llm")
    env.reset(sample())
    contradicted = DoctorEnv.step_batch([env], ["<question>Does the pain get worse when you breathe in deeply?</question>"])[0]
    assert contradicted.info.counts == {"questions": 1, "relevant_questions": 1, "patient_checked": 1}  # the case says yes
    refused = DoctorEnv.step_batch([env], ["<question>Do you have a fever?</question>"])[0]
    assert refused.info.counts["patient_refusals"] == 1 and refused.info.counts["patient_checked"] == 1
    assert "patient_agreed" not in refused.info.counts
    leaked = DoctorEnv.step_batch([env], ["<question>Does the pain spread to your left arm?</question>"])[0]
    assert leaked.info.counts["patient_leaks"] == 1
    assert DoctorEnv.ratios["patient_faithfulness"] == ("patient_agreed", "patient_checked")


def test_max_turns_minus_one_draws_each_budget_from_two_to_ten_as_the_seed_does(tokenizer):
    from posttrain.config import ConfigError, load_config
    from posttrain.rollout.agent import AgentRollout

    config = load_config([], ["env.name=doctor", "env.max_turns=-1", "env.options={patient: rule}", "data.max_response_length=512"])
    rollout = AgentRollout(config, tokenizer, None)
    assert rollout.loop_config.turns_range == (2, 10)
    with pytest.raises(ConfigError, match="env.max_turns = -2"):
        load_config([], ["env.name=doctor", "env.max_turns=-2"])


def test_the_patient_probe_asks_each_yes_no_finding_and_counts_agreement():
    """CASE has three yes/no findings (yes, no, no): a patient that always says yes agrees on 1 of 3;
    one that answers as the case does agrees on all; a failed reply (no answer) is left out."""
    from posttrain.agents.doctor import patient_faithfulness

    always_yes = FakeLLM(["Yes."])
    assert patient_faithfulness(always_yes, [sample()]) == (pytest.approx(1 / 3), 3)
    (conversations,) = always_yes.calls
    assert [c[-1]["content"] for c in conversations] == [pair.question for pair in CASE.qa]  # each a first question
    faithful = FakeLLM([[EnvLLMReply(pair.answer, "stop") for pair in CASE.qa]])
    assert patient_faithfulness(faithful, [sample(), sample()], max_questions=3) == (1.0, 3)
    failing = FakeLLM([[EnvLLMReply("", "error", error="down"), EnvLLMReply("No.", "stop"), EnvLLMReply("No.", "stop")]])
    assert patient_faithfulness(failing, [sample()]) == (1.0, 2)
