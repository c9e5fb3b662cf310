"""The plain JSON-lines tool format, added as one file of models/tool_formats/: it registers itself,
tells the tools, reads calls from lines, and carries results back, through the same tool environment."""

from __future__ import annotations

import json

import pytest

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, run_episodes
from posttrain.cli.preflight import load_run_config
from posttrain.config import ConfigError
from posttrain.errors import InputError
from posttrain.models import tokenize_prompts
from posttrain.models.tool_formats import FORMATS, format_class, format_names, make_tool_format
from posttrain.models.tool_formats.jsonl import JsonLinesFormat
from posttrain.rewards.manager import RewardManager
from posttrain.rollout.scoring import score_episode_answers
from posttrain.tools import ParsedCall, ToolBox, load_tools
from posttrain.tools.env import ToolEnv
from tests.agents.test_loop import ScriptedEngine


def line(name: str, arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_the_format_registers_itself_and_the_config_names_it():
    assert FORMATS["jsonl"] is JsonLinesFormat and "jsonl" in format_names()
    assert format_class("jsonl", None) is JsonLinesFormat
    with pytest.raises(InputError, match="is not a tool format; use auto or one of builtin, jsonl, template"):
        format_class("xml", None)
    with pytest.raises(ConfigError, match="env.tool_format = 'xml'.*is not a tool format"):
        load_run_config([], ["env.name=tools", "env.tools=[posttrain.tools:calculator]", "env.tool_format=xml"])
    with pytest.raises(ConfigError, match="env.tool_format=jsonl reads its own calls"):
        load_run_config([], ["env.name=tools", "env.tools=[posttrain.tools:calculator]", "env.tool_format=jsonl", "env.tool_parser=hermes"])


def test_the_prompt_lists_each_tool_on_a_line_after_the_conversation_s_own_system_text(tokenizer):
    tools = load_tools(["posttrain.tools:calculator"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    text = tokenizer.decode(tokenize_prompts([messages], tokenizer, [t.schema for t in tools], tool_format="jsonl")[0])
    schema_line = json.dumps(tools[0].schema, ensure_ascii=False)
    assert text.index("Be brief.") < text.index('like {"name": "calculator", "arguments": {...}}') < text.index(schema_line) \
        < text.index("What is 2+2?")
    assert "<tool_call>" not in text and "<tools>" not in text


def test_calls_are_lines_that_are_json_objects_and_the_rest_is_text():
    read = JsonLinesFormat(None).parse
    turn = read("Let me compute.\n" + line("calculator", {"expression": "1+1"}) + "\n  " + line("lookup", {}) + "\n")
    assert turn.calls == [ParsedCall("calculator", '{"expression": "1+1"}'), ParsedCall("lookup", "{}")]
    assert turn.content == "Let me compute." and turn.malformed == 0 and not turn.is_final
    assert read('{"name": "calculator"}').calls == [ParsedCall("calculator", "{}")]  # no arguments: none
    answer = 'The answer is 2. {"x": 1} is not a call.'
    assert read(answer).is_final and read(answer).content == answer
    broken = read('{"name": "calculator", "arguments": {"expression": "1+1"}\n{"name": 3}\n{"name": "f", "arguments": [1]}')
    assert broken.calls == [] and broken.malformed == 3 and not broken.is_final
    mixed = read(line("calculator", {"expression": "2"}) + '\n{"name": "calculator", "arguments": ')
    assert len(mixed.calls) == 1 and mixed.malformed == 1


def test_results_come_back_one_json_line_per_call_as_a_user_message():
    results = [("calculator", "4"), ("lookup", 'said "hi"\nline two')]
    text = JsonLinesFormat(None).observation(results)
    assert [json.loads(row) for row in text.split("\n")] == [{"name": n, "content": c} for n, c in results]
    assert JsonLinesFormat.observation_role == "user"


def test_an_episode_in_the_jsonl_format_calls_reads_its_result_and_is_told_how_to_write_a_bad_call(tokenizer):
    tools = load_tools(["posttrain.tools:calculator"])
    tool_format = make_tool_format("jsonl", tokenizer, [t.schema for t in tools])
    box = ToolBox(tools, tool_format=tool_format, timeout_s=10, max_calls=4)
    try:
        sample = EpisodeSample([{"role": "user", "content": "episode 0"}], "56088", "arithmetic")  # ScriptedEngine reads "episode k"
        prompts = tokenize_prompts([sample.prompt], tokenizer, box.schemas, tool_format="jsonl")
        script = ['{"name": "calculator", "arguments": {"expression": "123 *', line("calculator", {"expression": "123 * 456"}), "56088"]
        engine = ScriptedEngine(tokenizer, prompts, [script], eos_after=True)
        config = AgentLoopConfig(max_response_length=1024, max_turns=4, max_turn_tokens=96, max_obs_length=256)
        (episode,) = run_episodes([ToolEnv(box)], [sample], prompts, engine, ObservationRenderer(tokenizer, "user"), config)
        score_episode_answers(RewardManager(tokenizer, timeout_s=None), [episode], [sample])
    finally:
        box.close()
    bad, good = episode.observations[:2]
    told = json.loads(bad)["content"]
    assert told.startswith("Error (bad_json)") and 'on a line of its own as {"name": ..., "arguments": {...}}' in told
    assert json.loads(good) == {"name": "calculator", "content": "56088"}
    assert episode.success and episode.reward == 1.0 and episode.counts["tool/successes"] == 1


def test_posttrain_tools_lists_the_formats_and_prints_a_prompt_in_the_one_asked_for(capsys):
    from posttrain.cli.main import main
    from posttrain.models import cached_tiny_model

    assert main(["tools", "--formats"]) == 0
    assert capsys.readouterr().out.split() == ["builtin", "jsonl", "template"]
    assert main(["tools", "posttrain.tools:calculator", "--model", str(cached_tiny_model("llama")), "--format", "jsonl"]) == 0
    shown = capsys.readouterr().out
    assert "in the jsonl format" in shown and 'like {"name": "calculator", "arguments": {...}}' in shown and "<tool_call>" not in shown
