"""The agent loop with a scripted engine and a toy environment: masks, budgets, rewards."""

from __future__ import annotations

import pytest

from posttrain.agents import (
    AgentLoopConfig, Environment, EpisodeSample, ObservationRenderer, StepInfo, StepResult, TurnOutput, run_episodes,
)
from posttrain.metrics import total


class CounterEnv(Environment):
    """``<go>`` → observation "count N" (reward ``turn_reward``); ``<done>`` → done, reward 1; else invalid."""

    name = "counter"
    step_batch_calls: list[int] = []

    def __init__(self, turn_reward: float = 0.0, observation: str = "count {n}") -> None:
        self.turn_reward, self.observation, self.n = turn_reward, observation, 0

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("</go>",)

    def reset(self, sample: EpisodeSample) -> str:
        return ""

    def step(self, action: str) -> StepResult:
        if "<done>" in action:
            return StepResult("", 1.0, True, StepInfo(valid=True, effective=True, success=True, counts={"answers": 1}))
        if "<go>" in action:
            self.n += 1
            return StepResult(self.observation.format(n=self.n), self.turn_reward, False, StepInfo(True, True, counts={"goes": 1}))
        return StepResult("invalid: write <go> or <done>", -0.5, False, StepInfo(False, False, counts={"invalid": 1}))

    def final_turn_instruction(self) -> str:
        return "FINAL: write <done> now."

    @classmethod
    def step_batch(cls, envs, actions):
        cls.step_batch_calls.append(len(envs))
        return super().step_batch(envs, actions)


class ScriptedEngine:
    """Answers episode k's turn t with ``scripts[k][t]`` tokenised; logprobs -(position+1)/100."""

    def __init__(self, tokenizer, prompts: list[list[int]], scripts: list[list[str]], *, eos_after: bool = False) -> None:
        self.tokenizer, self.prompts, self.scripts, self.eos_after = tokenizer, prompts, scripts, eos_after
        self.turns: dict[int, int] = {}
        self.emitted: dict[int, list[list[int]]] = {k: [] for k in range(len(prompts))}
        self.calls: list[int] = []

    def __call__(self, contexts, max_new_tokens, stop, request_keys):
        self.calls.append(len(contexts))
        outputs = []
        for context in contexts:
            text = self.tokenizer.decode(context[: len(self.prompts[0]) + 20])
            episode = next(k for k in range(len(self.prompts)) if f"episode {k}<" in text)
            t = self.turns.get(episode, 0)
            self.turns[episode] = t + 1
            tokens = self.tokenizer.encode(self.scripts[episode][min(t, len(self.scripts[episode]) - 1)], add_special_tokens=False)
            if self.eos_after:
                tokens.append(self.tokenizer.eos_token_id)
            tokens = tokens[:max_new_tokens]
            self.emitted[episode].append(tokens)
            outputs.append(TurnOutput(tokens, [-(p + 1) / 100 for p in range(len(tokens))], "stop", weight_version=3))
        return outputs


def _prompts(tokenizer, count: int) -> tuple[list[EpisodeSample], list[list[int]]]:
    samples = [EpisodeSample([{"role": "user", "content": f"episode {k}"}], ground_truth=None) for k in range(count)]
    prompts = [tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True, return_dict=False) for s in samples]
    return samples, [list(p) for p in prompts]


def _run(tokenizer, scripts, *, env_options=None, eos_after=False, **config):
    samples, prompts = _prompts(tokenizer, len(scripts))
    engine = ScriptedEngine(tokenizer, prompts, scripts, eos_after=eos_after)
    envs = [CounterEnv(**(env_options or {})) for _ in scripts]
    settings = {"max_response_length": 512, "max_turns": 4, "max_turn_tokens": 64, "max_obs_length": 64} | config
    episodes = run_episodes(envs, samples, prompts, engine, ObservationRenderer(tokenizer), AgentLoopConfig(**settings))
    return episodes, engine


def test_masks_line_up_token_by_token_with_engine_and_environment(tokenizer):
    episodes, engine = _run(tokenizer, [["<go>a</go>", "<go>b</go>", "<done>"], ["<done>"]])
    long, short = episodes
    assert (long.num_turns, short.num_turns) == (3, 1)
    expected_ids, expected_mask = [], []
    for turn, tokens in enumerate(engine.emitted[0]):
        expected_ids += tokens
        expected_mask += [1] * len(tokens)
        if turn < 2:  # the turn's end, the environment's message as ChatML writes a user turn, the next turn's start
            assert tokens[-1] != tokenizer.eos_token_id  # (a turn that sampled its end gets no second one: a test below)
            observation = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\ncount {turn + 1}<|im_end|>\n<|im_start|>assistant\n",
                                           add_special_tokens=False)
            expected_ids += observation
            expected_mask += [0] * len(observation)
    assert long.response_ids == expected_ids
    assert long.loss_mask == expected_mask
    agent_logprobs = [lp for tokens in engine.emitted[0] for lp in [-(p + 1) / 100 for p in range(len(tokens))]]
    assert [lp for lp, m in zip(long.logprobs, long.loss_mask) if m] == agent_logprobs
    assert all(lp == 0.0 for lp, m in zip(long.logprobs, long.loss_mask) if not m)
    observation_text = tokenizer.decode([t for t, m in zip(long.response_ids, long.loss_mask) if not m])
    assert observation_text == "<|im_end|>\n<|im_start|>user\ncount 1<|im_end|>\n<|im_start|>assistant\n" * 1 + \
        "<|im_end|>\n<|im_start|>user\ncount 2<|im_end|>\n<|im_start|>assistant\n"
    assert long.actions == ["<go>a</go>", "<go>b</go>", "<done>"]
    assert long.weight_version == 3


def test_only_live_episodes_are_generated_and_envs_step_in_one_batch_per_round(tokenizer):
    CounterEnv.step_batch_calls = []
    episodes, engine = _run(tokenizer, [["<done>"], ["<go>x</go>", "<done>"], ["<go>x</go>", "<go>y</go>", "<done>"]])
    assert engine.calls == [3, 2, 1]
    assert CounterEnv.step_batch_calls == [3, 2, 1]
    assert [e.num_turns for e in episodes] == [1, 2, 3]


def test_a_turn_that_sampled_eos_does_not_get_a_second_end_of_turn(tokenizer):
    episodes, _ = _run(tokenizer, [["<go>a</go>", "<done>"]], eos_after=True)
    text = tokenizer.decode(episodes[0].response_ids)
    assert "<|im_end|><|im_end|>" not in text
    assert text.startswith("<go>a</go><|im_end|>\n<|im_start|>user\ncount 1<|im_end|>\n<|im_start|>assistant\n<done>")


def test_turn_budget_then_one_forced_final_turn(tokenizer):
    episodes, engine = _run(tokenizer, [["<go>a</go>"] * 5 + ["<done>"]], max_turns=2)
    episode = episodes[0]
    assert episode.num_turns == 3  # two ordinary turns, then the forced final one
    assert episode.forced_final and episode.done
    assert episode.actions == ["<go>a</go>", "<go>a</go>", "<go>a</go>"]
    # the instruction comes with the second observation, after the observation itself
    second_observation = tokenizer.decode(episode.response_ids[episode.turn_ends[1] + 1 : episode.turn_starts[2]])
    assert "count 2\nFINAL: write <done> now." in second_observation
    assert episode.turn_rewards == [0.0, 0.0, 0.0]  # the final <go> is stepped by finish(): not done by itself, ended anyway


def test_zero_turn_budget_puts_the_instruction_in_the_prompt(tokenizer):
    episodes, _ = _run(tokenizer, [["<done>"]], max_turns=0)
    episode = episodes[0]
    assert episode.num_turns == 1 and episode.forced_final and episode.reward == 1.0
    prompt = tokenizer.decode(episode.prompt_ids)
    assert prompt.endswith("episode 0<|im_end|>\n<|im_start|>user\nFINAL: write <done> now.<|im_end|>\n<|im_start|>assistant\n")


def test_turn_budgets_drawn_from_a_range_are_seeded_and_in_range(tokenizer):
    from posttrain.agents import turn_budgets

    config = AgentLoopConfig(max_response_length=8, turns_range=(1, 3), seed=5)
    keys = [f"prompt{i // 4}-{i % 4}" for i in range(64)]
    budgets = turn_budgets(keys, config)
    assert set(budgets) == {1, 2, 3}
    # a budget belongs to its episode's key: the same keys in another order draw the same budgets
    assert turn_budgets(keys[::-1], config) == budgets[::-1]
    assert turn_budgets(keys, AgentLoopConfig(max_response_length=8, turns_range=(1, 3), seed=6)) != budgets
    episodes, _ = _run(tokenizer, [["<go>a</go>"]] * 6, turns_range=(0, 2), seed=1)
    assert all(e.num_turns == e.turn_budget + 1 for e in episodes)


def test_per_turn_rewards_sit_on_each_turns_last_token(tokenizer):
    episodes, _ = _run(tokenizer, [["<go>a</go>", "nonsense", "<done>"]], env_options={"turn_reward": 0.25})
    episode = episodes[0]
    assert episode.turn_rewards == [0.25, -0.5, 1.0]
    assert episode.reward == pytest.approx(0.75)
    for start, end in zip(episode.turn_starts, episode.turn_ends):
        assert episode.loss_mask[start : end + 1] == [1] * (end - start + 1)
        assert end + 1 == len(episode.loss_mask) or episode.loss_mask[end + 1] == 0
    assert episode.valid_actions == 2 and episode.effective_actions == 2
    assert dict(episode.counts) == {"goes": 1, "invalid": 1, "answers": 1}


def test_observations_leave_room_for_a_full_next_turn(tokenizer):
    episodes, _ = _run(tokenizer, [["<go>a</go>"] * 10], env_options={"observation": "data " * 200},
                       max_response_length=120, max_turn_tokens=40, max_obs_length=200, max_turns=5)
    episode = episodes[0]
    for start in episode.turn_starts:
        assert 120 - start >= 40  # every turn started with max_turn_tokens of room
    assert episode.out_of_tokens and episode.num_turns == 2


def test_response_budget_cuts_the_episode_and_the_engines_overshoot(tokenizer):
    long_turn = "<go>" + " word" * 40 + "</go>"
    episodes, _ = _run(tokenizer, [[long_turn] * 10], max_response_length=60, max_turn_tokens=64)
    episode = episodes[0]
    assert len(episode.response_ids) <= 60
    assert episode.out_of_tokens and episode.done
    assert len(episode.loss_mask) == len(episode.response_ids) == len(episode.logprobs)


def test_long_observations_are_truncated_to_max_obs_length(tokenizer):
    episodes, _ = _run(tokenizer, [["<go>a</go>", "<done>"]], env_options={"observation": "data " * 200}, max_obs_length=30)
    episode = episodes[0]
    observation = episode.response_ids[episode.turn_ends[0] + 1 : episode.turn_starts[1]]
    assert len(observation) == 30
    assert episode.observations_truncated == 1
    assert tokenizer.decode(observation).endswith("...(truncated)<|im_end|>\n<|im_start|>assistant\n")


def test_episode_metrics(tokenizer):
    from posttrain.agents import episode_metrics

    episodes, _ = _run(tokenizer, [["<done>"], ["nonsense", "<done>"]])
    metrics = episode_metrics(episodes, group_ids=[0, 0], counters=("invalid", "goes"))
    assert metrics["env/goes"].value == 0.0  # declared, never seen
    assert metrics["num_turns/mean"].value == 1.5
    assert metrics["agent/valid_action_ratio"].value == pytest.approx(2 / 3)
    assert metrics["agent/success_rate"].value == 1.0
    assert metrics["env/invalid"] == total(1.0)  # the step's count: one invalid action over the two episodes
    assert metrics["agent/reward_std_in_group"].value == pytest.approx(0.25)  # rewards 1.0 and 0.5


def test_bad_settings_are_reported_together():
    with pytest.raises(ValueError, match="max_turns=-1.*max_turn_tokens=0"):
        AgentLoopConfig(max_response_length=10, max_turns=-1, max_turn_tokens=0)


def test_observations_can_use_the_tool_role(tokenizer):
    rendered = ObservationRenderer(tokenizer, "tool").render("found it", after_token=None, budget=64)
    assert tokenizer.decode(rendered.token_ids) == "<|im_end|>\n<|im_start|>tool\nfound it<|im_end|>\n<|im_start|>assistant\n"
    assert ObservationRenderer(tokenizer).render("x" * 10, after_token=None, budget=3) is None  # the template alone needs more
