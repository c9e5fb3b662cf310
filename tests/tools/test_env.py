"""The tool environment in the agent loop, with a scripted engine: calls run, results come back as
observation tokens appended to exactly what was sampled, errors are read by the model, answers scored."""

from __future__ import annotations

import json

import pytest

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, episode_metrics, run_episodes
from posttrain.tools.env import ToolEnv
from posttrain.models import tokenize_prompts
from posttrain.models.tool_formats.builtin import BuiltinFormat
from posttrain.rewards.manager import RewardManager
from posttrain.rollout.scoring import score_episode_answers
from posttrain.tools import ToolBox, load_tools
from tests.agents.test_loop import ScriptedEngine


def call(expression: str, name: str = "calculator") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"expression": expression}}) + "\n</tool_call>"


@pytest.fixture
def toolbox(tokenizer):
    tools = load_tools(["posttrain.tools:calculator"])
    box = ToolBox(tools, tool_format=BuiltinFormat(tokenizer, [t.schema for t in tools], "hermes"), timeout_s=10, max_calls=2)
    yield box
    box.close()


def play(tokenizer, toolbox, scripts, truths, *, max_turns=3, max_obs_length=256):
    """Episodes k = 0.. of ``scripts[k]`` (the agent's turns, eos after each) on "What is ...?" prompts."""
    samples = [EpisodeSample([{"role": "user", "content": f"episode {k}"}], truth, "arithmetic") for k, truth in enumerate(truths)]
    prompts = tokenize_prompts([s.prompt for s in samples], tokenizer, toolbox.schemas)
    engine = ScriptedEngine(tokenizer, prompts, scripts, eos_after=True)
    envs = [ToolEnv(toolbox) for _ in scripts]
    config = AgentLoopConfig(max_response_length=1024, max_turns=max_turns, max_turn_tokens=96, max_obs_length=max_obs_length)
    episodes = run_episodes(envs, samples, prompts, engine, ObservationRenderer(tokenizer, "user"), config)
    score_episode_answers(RewardManager(tokenizer, timeout_s=None), episodes, samples)  # the answers, by the reward path
    return episodes, engine


def test_the_prompt_tells_the_model_its_tools_in_the_builtin_format(tokenizer, toolbox):
    text = tokenizer.decode(tokenize_prompts([[{"role": "user", "content": "What is 2+2?"}]], tokenizer, toolbox.schemas)[0])
    assert text.index("<tools>") < text.index("Evaluate an arithmetic expression") < text.index("</tools>") < text.index("What is 2+2?")


def test_a_call_its_result_and_the_answer_token_by_token(tokenizer, toolbox):
    (episode,), engine = play(tokenizer, toolbox, [[call("123 * 456"), "123 * 456 = 56088"]], ["56088"])
    assert episode.done and episode.success and episode.reward == 1.0
    # the episode is exactly what the engine sampled, and what the loop appended between the turns
    first, second = engine.emitted[0]
    observation = ObservationRenderer(tokenizer, "user").render(
        '<tool_response>\n{"name": "calculator", "content": "56088"}\n</tool_response>', after_token=first[-1], budget=256,
    ).token_ids
    assert episode.response_ids == first + observation + second
    assert episode.loss_mask == [1] * len(first) + [0] * len(observation) + [1] * len(second)
    assert [lp for lp, m in zip(episode.logprobs, episode.loss_mask) if m] == [-(p + 1) / 100 for p in range(len(first))] + \
        [-(p + 1) / 100 for p in range(len(second))]
    assert episode.counts["tool/calls"] == 1 and episode.counts["tool/successes"] == 1


def test_a_wrong_answer_without_the_tool_scores_zero(tokenizer, toolbox):
    (episode,), _ = play(tokenizer, toolbox, [["123 * 456 = 56000"]], ["56088"])
    assert episode.done and not episode.success and episode.reward == 0.0 and episode.num_turns == 1


def test_errors_are_observations_the_model_reads_and_the_episode_goes_on(tokenizer, toolbox):
    broken = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"</tool_call>'
    scripts = [[broken, call("1+1", name="abacus"), call("1+1") + call("2+2") + call("3+3"), "2"]]
    (episode,), _ = play(tokenizer, toolbox, scripts, ["2"], max_turns=4)
    shown = episode.observations
    assert "Error (bad_json)" in shown[0]
    assert "Error (unknown_tool)" in shown[1] and "the tools are calculator" in shown[1]
    # two calls allowed per episode, the unknown tool's included: of the third turn's calls only the first runs
    assert '"content": "2"' in shown[2] and '"content": "4"' not in shown[2] and shown[2].count("Error (over_budget)") == 2
    assert episode.success and episode.reward == 1.0
    metrics = episode_metrics([episode], counters=ToolEnv.counters, ratios=ToolEnv.ratios)
    assert metrics["tool/calls"].value == 5 and metrics["tool/errors"].value == 4
    assert metrics["tool/errors/bad_json"].value == metrics["tool/errors/unknown_tool"].value == 1
    assert metrics["tool/errors/over_budget"].value == metrics["tool/calculator/errors/over_budget"].value == 2
    assert metrics["tool/success_rate"].value == pytest.approx(1 / 5)
    assert metrics["tool/calculator/calls"].value == 3 and "env/tool/calls" not in metrics


def test_a_call_counted_malformed_beside_read_ones_leaves_those_to_run(tokenizer, toolbox):
    # a call marker inside an argument is one call more than the parser reads: the turn holds a malformed
    # call before its two read ones, and each read call is still the one run, in its own place
    text = call("2*3") + call("4+5 <tool_call>")
    turn = toolbox.read(text)
    assert (turn.malformed, len(turn.calls)) == (1, 2)
    (episode,), _ = play(tokenizer, toolbox, [[text, "6"]], ["6"])
    (shown,) = episode.observations
    assert shown.count("<tool_response>") == 3 and shown.count("Error (bad_json)") == 1
    assert shown.index("Error (bad_json)") < shown.index('"content": "6"')
    assert episode.counts["tool/calls"] == 3 and episode.counts["tool/calculator/calls"] == 2 and episode.success


def test_a_call_in_the_forced_final_turn_is_not_run_and_earns_nothing(tokenizer, toolbox):
    (episode,), _ = play(tokenizer, toolbox, [[call("1+1"), call("1+1")]], ["2"], max_turns=1)
    assert episode.forced_final and episode.done and episode.reward == 0.0 and not episode.success
    assert episode.counts["tool/calls"] == 1 and episode.counts["tool/late_calls"] == 1


def test_every_episodes_calls_of_a_round_go_to_the_toolbox_together(tokenizer, toolbox, monkeypatch):
    batches = []
    run = toolbox.run
    monkeypatch.setattr(toolbox, "run", lambda calls, *rest: batches.append(len(calls)) or run(calls, *rest))
    episodes, _ = play(tokenizer, toolbox, [[call("1+1"), "2"], [call("2*3"), "6"], ["7"]], ["2", "6", "7"])
    assert batches == [2]
    assert [e.success for e in episodes] == [True, True, True]


def test_a_row_without_a_score_function_is_refused_when_no_tool_class_scores_it_and_no_custom_function_does():
    from posttrain.rollout.toolbox import sample_checker
    from posttrain.config.schema import EnvConfig

    row = EpisodeSample([{"role": "user", "content": "x"}], "1", "nowhere")
    env = EnvConfig(name="tools", tools=["posttrain.tools:calculator"])
    with pytest.raises(ValueError, match="no score function for data_source 'nowhere'.*reward()"):
        sample_checker(env)(row)  # what the rollout runs on every row before any worker starts
    sample_checker(env, by_data_source=False)(row)  # a custom function scores every row
    ToolEnv.check_sample(row, {}, scores_episodes=True)  # so does a tool class's reward()


def test_answers_go_to_the_reward_path_capped_without_a_successful_call_and_failures_are_counted(tokenizer, toolbox):
    """The answer is handed over, not scored by the environment: the reward path scores it (here with
    answer_without_call_score=0.25, an answer with no successful call is capped), and a score function
    that raises scores 0 and is counted for the reward breaker, never stopping the loop."""
    samples = [EpisodeSample([{"role": "user", "content": f"episode {k}"}], "56088", "arithmetic") for k in range(2)]
    prompts = tokenize_prompts([s.prompt for s in samples], tokenizer, toolbox.schemas)
    config = AgentLoopConfig(max_response_length=1024, max_turns=3, max_turn_tokens=96, max_obs_length=256)

    def episodes(manager):
        engine = ScriptedEngine(tokenizer, prompts, [["56088"], [call("123 * 456"), "56088"]], eos_after=True)
        envs = [ToolEnv(toolbox, answer_without_call_score=0.25) for _ in samples]
        played = run_episodes(envs, samples, prompts, engine, ObservationRenderer(tokenizer, "user"), config)
        assert [e.reward for e in played] == [0.0, 0.0]  # nothing scored by the environment itself
        return played, score_episode_answers(manager, played, samples)

    played, (metrics, failure) = episodes(RewardManager(tokenizer, timeout_s=None))
    assert [e.reward for e in played] == [0.25, 1.0] and [e.success for e in played] == [True, True] and failure is None
    assert metrics["reward/samples"].value == 2 and metrics["reward/errors"].value == 0

    def broken(solution_str, ground_truth):
        raise ZeroDivisionError("no")

    played, (metrics, failure) = episodes(RewardManager(tokenizer, score_functions={"arithmetic": broken}, timeout_s=None))
    assert [e.reward for e in played] == [0.0, 0.0] and not any(e.success for e in played)
    assert metrics["reward/errors"].value == 2 and "ZeroDivisionError" in failure


def test_each_failed_call_costs_call_error_penalty_and_a_late_call_one(toolbox):
    env = ToolEnv(toolbox, call_error_penalty=-0.25)
    env.reset(EpisodeSample([{"role": "user", "content": "x"}], "2", "arithmetic"))
    assert env.step(call("1+1", name="abacus")).reward == -0.25                      # an unknown tool
    assert env.step(call("1+1") + call("1+")).reward == -0.25                        # one of two failed
    assert env.step(call("2+2")).reward == -0.25                                      # past max_calls=2: over budget
    assert env.finish(call("3+3")).reward == -0.25 and env.finish(call("3+3")).info.counts == {"tool/late_calls": 1}
    with pytest.raises(ValueError, match="call_error_penalty=0.5 is added per failed call, so it must be <= 0"):
        ToolEnv(toolbox, call_error_penalty=0.5)
