"""Circuit breakers: a step whose rewards, retriever or env LLM failed as a whole, or updates skipped
for non-finite gradients several steps in a row, stop the run with a message that says what to change;
a partial failure below the threshold does not."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, episode_metrics, run_episodes
from posttrain.agents.doctor import DoctorEnv
from posttrain.agents.env_llm import EnvLLMClient, EnvLLMReply, OpenAIChatClient
from posttrain.agents.retriever import Document, Hit, RetrieverClient, RetrieverError
from posttrain.agents.retriever.process import free_port
from posttrain.agents.search import SearchEnv
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import check_breakers
from posttrain.errors import PosttrainError
from posttrain.rewards import RewardManager, build_reward_manager
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakerError, CircuitBreakers
from posttrain.metrics import mean, merge, total, values
from posttrain.rollout.single_turn import SingleTurnRollout
from posttrain.trainer.tracking import ConsoleTracker
from tests.agents.test_doctor_env import sample as doctor_sample
from tests.agents.test_loop import ScriptedEngine
from tests.rewards.helpers import CharTokenizer, response_batch, write_module

NO_REWARD_MODEL = SimpleNamespace(reward_model=None)


def _failing_half(solution_str, ground_truth):
    if solution_str.startswith("bad"):
        return 1 / 0
    return 1.0


def _scored(texts: list[str], score_function=_failing_half) -> tuple[dict[str, float], SingleTurnRollout]:
    """A single-turn rollout's reward phase over ``texts``: its metrics, and the rollout (with its first failures)."""
    rollout = SingleTurnRollout(RewardManager(CharTokenizer(), score_function=score_function, timeout_s=None), 8, 0)
    _, metrics = rollout.score(NO_REWARD_MODEL, response_batch(texts, [[1] * 5] * len(texts), ["x"] * len(texts), ["-"] * len(texts)))
    return metrics, rollout


# ---- rewards -------------------------------------------------------------------------------------


def test_every_reward_erroring_stops_the_run_naming_the_numbers_the_error_and_the_key():
    metrics, rollout = _scored(["bad"] * 64)
    with pytest.raises(CircuitBreakerError) as caught:
        CircuitBreakers(BreakerLimits()).check_rollout(metrics, 3, notes=rollout.first_failures)
    message = str(caught.value)
    assert "circuit breaker 'reward': 64 of 64 rewards errored or timed out in step 3" in message
    assert "(first: sample 0: ZeroDivisionError: division by zero" in message
    assert "custom_reward_function.stop_at_failed_fraction (now 1: " in message
    assert isinstance(caught.value, PosttrainError) and message.endswith("resumes from the last checkpoint (trainer.resume_mode=auto)")


def test_rewards_failing_in_part_stop_only_at_the_configured_fraction():
    metrics, rollout = _scored(["bad", "ok", "bad", "ok"])
    assert metrics["reward/errors"].value == 2.0 and metrics["reward/samples"].value == 4.0
    CircuitBreakers(BreakerLimits()).check_rollout(metrics, 1, notes=rollout.first_failures)  # 2 of 4: goes on
    CircuitBreakers(BreakerLimits(reward=0.75)).check_rollout(metrics, 1)
    with pytest.raises(CircuitBreakerError, match="2 of 4 rewards"):
        CircuitBreakers(BreakerLimits(reward=0.5)).check_rollout(metrics, 1)
    all_bad, _ = _scored(["bad"] * 4)
    CircuitBreakers(BreakerLimits(reward=None)).check_rollout(all_bad, 1)  # null: never


@pytest.mark.timeout(60)
def test_a_score_function_sleeping_past_the_step_budget_times_out_the_step_and_trips(tmp_path):
    path = write_module(tmp_path / "sleepy.py", """
        import time

        def compute_score(solution_str, ground_truth):
            time.sleep(5)
            return 1.0
    """)
    manager = build_reward_manager(CharTokenizer(), custom_path=str(path), timeout_s=30, budget_s=1.0)
    rollout = SingleTurnRollout(manager, 8, 0)
    try:
        started = time.monotonic()
        _, metrics = rollout.score(NO_REWARD_MODEL, response_batch(["a", "b", "c", "d"], [[1, 1]] * 4, ["x"] * 4, ["-"] * 4))
        elapsed = time.monotonic() - started
    finally:
        manager.close()
    assert metrics["reward/timeouts"].value == 4.0 and elapsed < 15  # one budget, not 4 x 5 s
    with pytest.raises(CircuitBreakerError, match=r"4 of 4 rewards errored or timed out in step 1 \(first: sample 0: not "
                                                  r"scored within the budget of 1 s"):
        CircuitBreakers(BreakerLimits()).check_rollout(metrics, 1, notes=rollout.first_failures)


def test_an_asynchronous_batch_counts_all_its_units():
    # two units of 4 samples each; their counts add up when the units are joined
    units = [{"reward/samples": total(4), "reward/errors": total(3), "reward/timeouts": total(1)},
             {"reward/samples": total(4), "reward/errors": total(4), "reward/timeouts": total(0)}]
    merged = merge(units)
    assert (merged["reward/samples"].value, merged["reward/errors"].value, merged["reward/timeouts"].value) == (8.0, 7.0, 1.0)
    with pytest.raises(CircuitBreakerError, match="8 of 8 rewards errored or timed out in step 5, so the run stopped"):
        CircuitBreakers(BreakerLimits()).check_rollout(merged, 5)
    # one unit fine, the other failed: 4 of 8 is half, below the default limit (every call failed)
    CircuitBreakers(BreakerLimits()).check_rollout(merge([units[1], {"reward/samples": total(4)}]), 5)
    with pytest.raises(CircuitBreakerError, match="4 of 8 rewards"):
        CircuitBreakers(BreakerLimits(reward=0.5)).check_rollout(merge([units[1], {"reward/samples": total(4)}]), 5)


def test_breakers_count_with_counts_and_refuse_a_mean_in_their_place():
    # a rate made as a mean (e.g. per episode) is not a count: reading it as one would be a silent bug
    with pytest.raises(TypeError, match="'reward/errors', which is made as a mean, not a count"):
        CircuitBreakers(BreakerLimits()).check_rollout({"reward/samples": total(4), "reward/errors": mean(0.5, 4)}, 1)


# ---- the retriever ------------------------------------------------------------------------------


def _search_episodes(tokenizer, retriever, count: int = 3):
    """``count`` episodes that search twice, then answer: one retrieve call per turn for all of them."""
    samples = [EpisodeSample([{"role": "user", "content": f"episode {k}"}], ground_truth="Paris") for k in range(count)]
    prompts = [list(tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True, return_dict=False)) for s in samples]
    script = ["<search>capital of France</search>", "<search>France capital</search>", "<answer>Paris</answer>"]
    engine = ScriptedEngine(tokenizer, prompts, [script] * count)
    config = AgentLoopConfig(max_response_length=512, max_turns=4, max_turn_tokens=64, max_obs_length=64)
    episodes = run_episodes([SearchEnv(retriever) for _ in samples], samples, prompts, engine, ObservationRenderer(tokenizer), config)
    return episode_metrics(episodes, counters=SearchEnv.counters)


def test_a_retriever_refusing_connections_for_a_whole_step_stops_the_run(tokenizer):
    dead = RetrieverClient(f"http://127.0.0.1:{free_port()}", retries=0, timeout_s=2.0)
    try:
        metrics = _search_episodes(tokenizer, dead)
    finally:
        dead.close()
    assert metrics["env/retriever_errors"].value == 6.0 and metrics["env/searches"].value == 0.0  # 3 episodes' totals
    with pytest.raises(CircuitBreakerError, match=r"circuit breaker 'retriever': 6 of 6 retriever searches failed in step 2.*"
                                                  r"env.retriever.stop_at_failed_fraction"):
        CircuitBreakers(BreakerLimits()).check_rollout(metrics, 2)


class _DownOnce:
    """A retriever whose first call fails; later ones find one document."""

    def __init__(self) -> None:
        self.calls = 0

    def retrieve(self, queries, topk):
        self.calls += 1
        if self.calls == 1:
            raise RetrieverError("connection refused")
        return [[Hit(Document("d1", '"France"\nParis is the capital.'), 1.0)] for _ in queries]


def test_a_retriever_failing_for_part_of_a_step_does_not_stop_it(tokenizer):
    metrics = _search_episodes(tokenizer, _DownOnce())
    # half of each episode's searches failed: counted over the 3 episodes, logged once each, as counts (SUM)
    assert (metrics["env/retriever_errors"], metrics["env/searches"]) == (total(3.0), total(3.0))
    CircuitBreakers(BreakerLimits()).check_rollout(metrics, 1)
    with pytest.raises(CircuitBreakerError, match="3 of 6 retriever searches failed"):
        CircuitBreakers(BreakerLimits(retriever=0.5)).check_rollout(metrics, 1)


# ---- the env LLM ---------------------------------------------------------------------------------


def _ask_patients(llm: EnvLLMClient, count: int = 3) -> tuple[dict[str, float], dict[str, str]]:
    """One round of questions to LLM patients, then what the agent rollout takes from the client."""
    envs = [DoctorEnv(llm, patient="llm") for _ in range(count)]
    for env in envs:
        env.reset(doctor_sample())
    DoctorEnv.step_batch(envs, ["<question>Do you have a fever?</question>"] * count)
    notes = {"env LLM": llm.stats.first_error} if llm.stats.first_error else {}
    return llm.drain_metrics(), notes


def test_an_env_llm_answering_only_errors_stops_the_run():
    llm = OpenAIChatClient(f"http://127.0.0.1:{free_port()}", "patient", retries=0, timeout_s=2.0)
    try:
        metrics, notes = _ask_patients(llm)
    finally:
        llm.close()
    with pytest.raises(CircuitBreakerError) as caught:
        CircuitBreakers(BreakerLimits()).check_rollout(metrics, 4, notes=notes)
    message = str(caught.value)
    assert "circuit breaker 'env LLM': 3 of 3 env-LLM replies failed (finish_reason=error) in step 4" in message
    assert "(first: cannot reach the chat server at http://127.0.0.1:" in message and "env.llm.stop_at_failed_fraction" in message


class _HalfDown(EnvLLMClient):
    def _request(self, conversations):
        return [EnvLLMReply("", "error", error="HTTP 503") if i % 2 else EnvLLMReply("No fever.", "stop") for i in range(len(conversations))]

    def describe(self):
        return "a test's model"


def test_an_env_llm_failing_in_part_does_not_stop_the_run():
    metrics, notes = _ask_patients(_HalfDown(), count=4)
    assert (metrics["env_llm/failures"].value, metrics["env_llm/replies"].value) == (2.0, 4.0) and notes == {"env LLM": "HTTP 503"}
    CircuitBreakers(BreakerLimits()).check_rollout(metrics, 1, notes=notes)
    with pytest.raises(CircuitBreakerError, match=r"2 of 4 env-LLM replies failed .* \(first: HTTP 503\)"):
        CircuitBreakers(BreakerLimits(env_llm=0.5)).check_rollout(metrics, 1, notes=notes)


# ---- non-finite updates --------------------------------------------------------------------------

SKIPPED, APPLIED = {"actor/skipped": mean(1.0)}, {"actor/skipped": mean(0.0)}


def test_skipped_updates_stop_the_run_after_the_limit_in_a_row():
    breakers = CircuitBreakers(BreakerLimits(skipped_steps=3))
    for step, metrics in enumerate([SKIPPED, SKIPPED, APPLIED, SKIPPED, SKIPPED], start=1):
        breakers.check_update(metrics, step)  # an applied step starts the count anew
    assert breakers.skipped_in_a_row == 2
    with pytest.raises(CircuitBreakerError) as caught:
        breakers.check_update(SKIPPED, 6)
    assert ("circuit breaker 'non-finite': the actor's gradient was not finite (inf or nan) in every update of 3 steps in a "
            "row (steps 4 to 6)") in str(caught.value)
    assert "trainer.stop_after_skipped_steps (now 3; 0: never stop)" in str(caught.value)


def test_a_step_with_some_updates_applied_or_the_critic_skipping_alone():
    breakers = CircuitBreakers(BreakerLimits(skipped_steps=2))
    breakers.check_update({"actor/skipped": mean(0.5, 2)}, 1)  # one of two mini-batches applied: the weights moved
    breakers.check_update({"actor/skipped": mean(0.5, 2)}, 2)
    breakers.check_update({"actor/skipped": mean(0.0), "critic/skipped": mean(1.0)}, 3)
    with pytest.raises(CircuitBreakerError, match="the critic's gradient was not finite"):
        breakers.check_update({"actor/skipped": mean(0.0), "critic/skipped": mean(1.0)}, 4)
    never = CircuitBreakers(BreakerLimits(skipped_steps=0))
    for step in range(1, 10):
        never.check_update(SKIPPED, step)


def test_a_real_engine_with_a_non_finite_loss_trips_the_breaker_on_the_third_step(tmp_path):
    from posttrain.engines.training import TrainingEngine
    from tests.engines.training.helpers import engine_config, make_batch, make_small_lm, ppo_loss

    def poisoned(outputs, micro_batch, normalizer):
        loss, metrics = ppo_loss(outputs, micro_batch, normalizer)
        return loss * math.nan, metrics

    engine = TrainingEngine(engine_config(make_small_lm(tmp_path / "lm")))
    breakers, batch = CircuitBreakers(BreakerLimits(skipped_steps=3)), make_batch(2, seed=0)
    for step in (1, 2):
        breakers.check_update(engine.train_mini_batch(batch, poisoned), step)
    with pytest.raises(CircuitBreakerError, match="3 steps in a row"):
        breakers.check_update(engine.train_mini_batch(batch, poisoned), 3)
    assert engine.skipped_steps == 3 and engine.global_step == 0


def test_the_console_line_shows_skipped_updates_only_when_there_are_some():
    console = Console(record=True, width=200, force_terminal=False)
    tracker = ConsoleTracker(total_steps=3, console=console)
    tracker.log({"critic/score/mean": 0.5, "actor/skipped_total": 0.0}, 1)
    tracker.log({"critic/score/mean": 0.5, "actor/skipped_total": 2.0}, 2)
    lines = console.export_text().splitlines()
    assert lines[0] == "step 1/3 · reward 0.5" and lines[1] == "step 2/3 · reward 0.5 · skipped updates 2"


def test_a_running_count_over_mini_batches_is_its_last_value_not_a_mean(tmp_path):
    # the engine types its running count as such where it makes it; a step's other metrics are means over its updates
    from posttrain.engines.training import TrainingEngine
    from tests.engines.training.helpers import engine_config, make_batch, make_small_lm, ppo_loss

    def poisoned(outputs, micro_batch, normalizer):
        loss, metrics = ppo_loss(outputs, micro_batch, normalizer)
        return loss * math.nan, metrics

    engine, batch = TrainingEngine(engine_config(make_small_lm(tmp_path / "lm"))), make_batch(2, seed=0)
    steps = [engine.train_mini_batch(batch, loss) for loss in (poisoned, ppo_loss, poisoned)]
    assert [values(step)["actor/skipped_total"] for step in steps] == [1.0, 1.0, 2.0]
    merged = values(merge(steps))
    assert merged["actor/skipped"] == pytest.approx(2 / 3) and merged["actor/skipped_total"] == 2.0


# ---- configuration -------------------------------------------------------------------------------


def test_the_limits_come_from_the_config_and_bad_ones_are_reported():
    config = PosttrainConfig()
    assert BreakerLimits.from_config(config) == BreakerLimits(1.0, 1.0, 1.0, 1.0, 3)
    assert config.custom_reward_function.step_timeout_s == 600.0 and check_breakers(config) == []
    config.custom_reward_function.stop_at_failed_fraction = 0.0
    config.env.retriever.stop_at_failed_fraction = 1.5
    config.env.llm.stop_at_failed_fraction = None  # never: fine
    config.reward.judge.stop_at_failed_fraction = 2.0
    config.custom_reward_function.step_timeout_s = 0.0
    config.trainer.stop_after_skipped_steps = -1
    assert [p.key for p in check_breakers(config)] == [
        "custom_reward_function.stop_at_failed_fraction", "env.retriever.stop_at_failed_fraction",
        "reward.judge.stop_at_failed_fraction", "custom_reward_function.step_timeout_s", "trainer.stop_after_skipped_steps",
    ]
