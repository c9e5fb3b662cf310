"""An LLM judge as a rubric part (rewards/judge.py), against a stand-in OpenAI-compatible server whose
replies each test scripts: the parsers, the one batched request per scoring call, the rule that spares
the judge, the reply cache across a resume, failures and deadlines (and the judge's circuit breaker),
and the agreement check before training."""

import re

import numpy as np
import pytest

from posttrain.config.schema import EnvLLMConfig, PosttrainConfig
from posttrain.errors import InputError
from posttrain.metrics import values
from posttrain.rewards import build_reward_manager
from posttrain.rewards.judge import JudgeDisagrees, JudgeQuestion, gold_text
from posttrain.rewards.manager import Answer
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.scoring import check_judge, open_judge
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakerError, CircuitBreakers
from tests.chat_stub import Stub

POLITE = {"prompt": "Is this reply polite? Reply: <<{answer}>> Answer yes or no.", "parser": "yes_no"}


def polite_judge(question: str) -> str:
    """The stand-in judge: yes to a reply with "please", no reply it can read to one with "hmm", else no."""
    if "Say OK" in question:
        return "OK"
    reply = re.search(r"<<(.*)>>", question, re.DOTALL).group(1)
    return "Yes." if "please" in reply else "I cannot tell" if "hmm" in reply else "no"


@pytest.fixture
def stub():
    server = Stub(polite_judge)
    yield server
    server.close()


def judged_manager(stub, parts, **llm):
    """A rubric's manager connected to the stand-in judge as a run connects it (rollout/scoring.py open_judge)."""
    manager = build_reward_manager(None, rubric=parts, timeout_s=10.0)  # the rules in the scoring process, as in a run
    manager.judge_llm, manager.judge_timeout_s = EnvLLMConfig(url=stub.url, api_model="judge", retries=0, **llm), 30.0
    open_judge(manager, RolloutRoles(actor=None))
    return manager


def judge_prompts(stub) -> list[str]:
    return [r["body"]["messages"][-1]["content"] for r in stub.requests if "Say OK" not in r["body"]["messages"][-1]["content"]]


def answers(*texts, truth="4"):
    """Answers to "What is 2 + 2?" (None: one that could not be read)."""
    return [None if text is None else Answer(text, truth, "arithmetic", {"level": 1}, prompt=[{"role": "user", "content": "What is 2 + 2?"}])
            for text in texts]


@pytest.mark.parametrize(("parser", "reply", "read"), [
    ("yes_no", "Yes, they do.", 1.0), ("yes_no", "  no.", 0.0), ("yes_no", "Maybe yes", None), ("yes_no", "yesterday", None),
    ("score", "I give it 7 out of 10", 0.7), ("score", "Score: 10", 1.0), ("score", "12", None), ("score", "none", None),
    ("choice", "The answer is (B).", 0.5), ("choice", "A", 1.0), ("choice", "BA", None), ("choice", "D", None),
])
def test_each_parser_reads_a_number_or_says_it_cannot(parser, reply, read):
    question = JudgeQuestion("{answer}", parser, (("A", 1.0), ("B", 0.5), ("C", 0.0)) if parser == "choice" else (),
                             10.0 if parser == "score" else 1.0)
    assert question.read(reply) == read


def test_the_prompt_is_rendered_from_the_row_the_answer_and_the_gold_answers():
    question = JudgeQuestion("{question} | {answer} | {ground_truth} | {data_source} | {extra_info[level]}")
    (message,) = question.messages("four", {"target": ["4", "four"]}, [{"role": "user", "content": "What is 2 + 2?"}],
                                   "arithmetic", {"level": 1})
    assert message == {"role": "user", "content": "What is 2 + 2? | four | 4 / four | arithmetic | 1"}
    assert gold_text("Paris") == "Paris" and gold_text(np.array(["a", "b"])) == "a / b"
    with pytest.raises(KeyError):  # a key the row lacks: that answer's judge part fails, counted
        question.messages("four", "4", None, "arithmetic", {})


def test_judge_parts_are_asked_in_one_request_and_weighed_with_the_rules(stub):
    manager = judged_manager(stub, [{"name": "correct", "weight": 1.0, "rule": "arithmetic"},
                                    {"name": "polite", "weight": 1.0, "judge": POLITE}])
    try:
        scored = manager.score(answers("#### 4 please", "#### 5 please", "#### 4", "#### 4 hmm", None))
    finally:
        manager.close()
    assert len(judge_prompts(stub)) == 4  # the unreadable answer (None) is not asked
    assert scored.scores.tolist() == [1.0, 0.5, 0.5, 0.5, 0.0]
    assert list(scored.extra["rubric/polite"][:4]) == [1.0, 1.0, 0.0, 0.0] and np.isnan(scored.extra["rubric/polite"][4])
    assert list(scored.extra["rubric/polite/unparsable"][:4]) == [0, 0, 0, 1]
    assert list(scored.extra["acc"][:4]) == [1.0, 0.0, 0.0, 0.0]  # a yes/no judge's verdict counts with the rule's acc
    logged = values(scored.metrics)
    assert logged["reward/polite"] == 0.5 and logged["reward/polite/unparsable"] == 1 and logged["reward/correct"] == 0.75
    assert (logged["judge/requests"], logged["judge/replies"], logged["judge/failures"]) == (1, 4, 0)  # one batched request


def test_an_answer_the_rule_accepts_is_not_sent_to_the_judge(stub):
    judge = POLITE | {"rule": "arithmetic"}  # right by the rule, or polite by the judge
    manager = judged_manager(stub, [{"name": "accepted", "judge": judge}])
    try:
        scored = manager.score(answers("#### 4", "#### 5 please", "#### 5"))
    finally:
        manager.close()
    assert sorted(re.search(r"<<(.*)>>", p).group(1) for p in judge_prompts(stub)) == ["#### 5", "#### 5 please"]  # sent side by side
    assert scored.scores.tolist() == [1.0, 1.0, 0.0] and list(scored.extra["rubric/accepted/rule"]) == [1.0, 0.0, 0.0]


def test_replies_are_cached_for_the_run_and_its_resume(stub, tmp_path):
    cache = str(tmp_path / "run" / "judge_cache.sqlite")
    parts = [{"name": "polite", "judge": POLITE}]
    first = judged_manager(stub, parts, reply_cache=cache)
    try:
        before = first.score(answers("#### 4 please", "#### 4"))
    finally:
        first.close()
    assert len(judge_prompts(stub)) == 2
    resumed = judged_manager(stub, parts, reply_cache=cache)  # a new process's manager over the same file
    try:
        after = resumed.score(answers("#### 4 please", "#### 4", "#### 4 please!"))
    finally:
        resumed.close()
    assert len(judge_prompts(stub)) == 3  # only the new answer was asked
    assert after.scores.tolist() == before.scores.tolist() + [1.0]
    assert values(after.metrics)["judge/cached_replies"] == 2
    other_truth = judged_manager(stub, [{"name": "polite", "judge": POLITE | {"prompt": POLITE["prompt"] + " Gold: {ground_truth}"}}],
                                 reply_cache=cache)
    try:
        other_truth.score(answers("#### 4 please", truth="5"))
    finally:
        other_truth.close()
    assert len(judge_prompts(stub)) == 4  # another rendered prompt (its ground truth) is another key


def test_a_judge_that_fails_scores_zero_and_stops_the_run_when_all_fail(stub):
    manager = judged_manager(stub, [{"name": "correct", "rule": "arithmetic"}, {"name": "polite", "judge": POLITE}])
    try:
        stub.failures = [503, 503, 503]
        scored = manager.score(answers("#### 4 please", "#### 4 please", "#### 4 please"))
        stub.delay_s, manager.judge_timeout_s = 2.0, 0.3
        late = manager.score(answers("#### 4 please!"))
    finally:
        manager.close()
    assert scored.scores.tolist() == [0.5] * 3 and list(scored.extra["rubric/polite/errors"]) == [1.0] * 3
    logged = values(scored.metrics)
    assert (logged["judge/failures"], logged["judge/replies"], logged["reward/polite/errors"]) == (3, 3, 3)
    with pytest.raises(CircuitBreakerError, match=r"circuit breaker 'judge': 3 of 3 judge replies failed.*reward\.judge\.stop_at_failed_fraction"):
        CircuitBreakers(BreakerLimits()).check_rollout(scored.metrics, 7)
    assert late.scores.tolist() == [0.5] and values(late.metrics)["judge/failures"] == 1  # past its deadline: failed
    CircuitBreakers(BreakerLimits(judge=None)).check_rollout(scored.metrics, 7)  # null: never stops


def _rows(*truths):
    from posttrain.agents.env import EpisodeSample

    return [EpisodeSample([{"role": "user", "content": f"Say {t}."}], t, "arithmetic", {}) for t in truths]


SAME = {"prompt": 'Proposed: "{answer}". Correct: "{ground_truth}". Same? yes or no.', "parser": "yes_no", "rule": "arithmetic"}


def test_before_training_a_judge_that_disagrees_with_its_rule_is_refused(capsys):
    def fair(question):
        found = re.search(r'Proposed: "(.*)"\. Correct: "(.*)"', question)
        return "OK" if found is None else "yes" if found.group(1) == found.group(2) else "no"

    config = PosttrainConfig()
    cases = ((fair, "1.00 of 6 answers (right ones: 3 of 3, wrong ones: 3 of 3; 6 replies readable)"),
             (lambda question: "yes", "0.50 of 6 answers (right ones: 3 of 3, wrong ones: 0 of 3; 6 replies readable)"),
             (lambda question: "Hmm.", "0.00 of 6 answers (right ones: 0 of 3, wrong ones: 0 of 3; 0 replies readable)"))
    for judge, summary in cases:
        server = Stub(judge)
        manager = judged_manager(server, [{"name": "same", "judge": SAME}])
        try:
            if judge is fair:
                check_judge(config, manager, _rows("12", "7", "30"))
            else:  # always the same verdict, or none readable: refused
                with pytest.raises(JudgeDisagrees, match=re.escape(summary) + r", below reward\.judge\.min_agreement=0\.8"):
                    check_judge(config, manager, _rows("12", "7", "30"))
        finally:
            manager.close()
            server.close()
        assert len(judge_prompts(server)) == 6  # each row's own answer and another row's
        assert f"agrees with its rule on {summary}" in capsys.readouterr().out


def test_an_agreement_check_that_decides_nothing_is_skipped_and_a_missing_key_is_refused(capsys):
    server = Stub(lambda question: "yes")
    manager = judged_manager(server, [{"name": "same", "judge": SAME}])
    keyed = judged_manager(server, [{"name": "keyed", "judge": SAME | {"prompt": SAME["prompt"] + " Topic: {extra_info[topic]}"}}])
    try:
        check_judge(PosttrainConfig(), manager, _rows("12", "12"))  # no answer the rule rejects: nothing to check against
        assert "judge part 'same' is not checked" in capsys.readouterr().out
        with pytest.raises(InputError, match="names 'topic' of extra_info"):
            check_judge(PosttrainConfig(), keyed, _rows("12", "7"))
        scored = keyed.score(answers("#### 5", "#### 6"))  # while scoring, each such question fails, counted for the breaker
    finally:
        manager.close()
        keyed.close()
        server.close()
    assert judge_prompts(server) == [] and scored.scores.tolist() == [0.0, 0.0]
    logged = values(scored.metrics)
    assert (logged["judge/failures"], logged["judge/replies"], logged["reward/keyed/errors"]) == (2, 2, 2)
    with pytest.raises(CircuitBreakerError, match="circuit breaker 'judge'"):
        CircuitBreakers(BreakerLimits()).check_rollout(scored.metrics, 1)


def test_a_judge_part_makes_the_run_start_the_env_llm():
    from posttrain.rollout.env_llm import needs_env_llm_worker

    config = PosttrainConfig()
    assert not needs_env_llm_worker(config)
    config.reward.rubric = [{"name": "polite", "judge": POLITE}]
    assert needs_env_llm_worker(config)
    config.env.llm.url = "http://127.0.0.1:8000/v1"  # a server the user runs: no worker
    assert not needs_env_llm_worker(config)


DOCTOR_JUDGE = {"prompt": 'A doctor diagnosed: "{answer}". The correct diagnosis is: "{ground_truth}". '
                          "Do they name the same condition? Answer only yes or no.", "parser": "yes_no", "rule": "synthetic_doctor"}


def test_the_doctors_diagnosis_check_is_an_ordinary_rubric_part(tmp_path):
    """Fixed diagnoses over the doctor's held-out cases, replayed through the environment's own check
    (judge=llm) and through the reward path's rubric part (judge=rubric): the same verdicts, and the judge
    asked the same questions."""
    from posttrain.agents.doctor.env import DoctorEnv
    from posttrain.agents.env import EpisodeSample
    from posttrain.data import prepare, read_rows

    def judge(question):  # a scripted judge: yes when a long word of the diagnosis is in the correct names
        found = re.search(r'diagnosed: "(.*)"\. The correct diagnosis is: "(.*)"\.', question)
        if found is None:
            return "OK"
        return "yes" if any(len(w) > 4 and w in found.group(2).lower() for w in found.group(1).lower().split()) else "no"

    _, test = prepare("synthetic-doctor", tmp_path, train_size=20, val_size=12)
    rows = read_rows([test])
    names = [row.ground_truth["target"] for row in rows]
    replayed = [(row, diagnosis) for i, row in enumerate(rows) for diagnosis in dict.fromkeys(
        [names[i][0], names[i][-1], names[(i + 1) % len(rows)][0], f"acute {names[i][0]}", "unsure"])]
    server = Stub(judge)
    client_before = OpenAIChatClientFor(server)
    manager = judged_manager(server, [{"name": "diagnosis", "judge": DOCTOR_JUDGE}])
    try:
        before, answers_after = [], []
        for row, diagnosis in replayed:
            sample = EpisodeSample(list(row.messages), row.ground_truth, row.data_source, dict(row.extra_info))
            own, handed = DoctorEnv(client_before, patient="rule", judge="llm"), DoctorEnv(patient="rule", judge="rubric")
            own.reset(sample)
            handed.reset(sample)
            before.append(own.step(f"<diagnosis>{diagnosis}</diagnosis>").info.success)
            result = handed.step(f"<diagnosis>{diagnosis}</diagnosis>")
            assert result.done and result.answer.text == diagnosis and result.reward == handed.turn_penalty
            answers_after.append(Answer(result.answer.text, row.ground_truth, row.data_source, dict(row.extra_info), prompt=list(row.messages)))
        asked_before = judge_prompts(server)
        server.requests.clear()
        after = manager.score(answers_after)
    finally:
        manager.close()
        client_before.close()
        server.close()
    assert [bool(a) for a in after.extra["acc"]] == before and after.scores.tolist() == [float(b) for b in before]
    assert 0 < sum(before) < len(before)  # both verdicts occur, by rule and by judge
    assert sorted(judge_prompts(server)) == sorted(asked_before) and asked_before  # the same questions, the rule's matches unasked


def OpenAIChatClientFor(server):  # noqa: N802 - reads as the client it makes
    from posttrain.agents.env_llm import OpenAIChatClient

    return OpenAIChatClient(server.url, "judge", retries=0)
