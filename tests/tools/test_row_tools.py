"""Tools per row: each row's prompt is told its own tools (beside the run's), its calls are checked
against them, a call to a tool it does not have is ``unknown_tool``, and in ``answer: calls`` mode the
calls are the answer, handed to the row's score function instead of being run."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posttrain.agents import EpisodeSample
from posttrain.data.dataset import RLDataset
from posttrain.data.format import DataFormatError
from posttrain.data.sft_dataset import SFTDataset
from posttrain.errors import InputError
from posttrain.models.tool_formats.builtin import BuiltinFormat
from posttrain.tools import ToolBox, load_tools
from posttrain.tools import env as tool_env
from posttrain.tools.env import ToolEnv


def function(name: str, parameter: str, kind: str = "string") -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"{name} does its thing",
        "parameters": {"type": "object", "properties": {parameter: {"type": kind, "description": parameter}}, "required": [parameter]}}}


WEATHER = [function("get_weather", "city")]
STOCKS = [function("get_stock_price", "ticker"), function("get_dividend", "ticker")]


def row(question: str, tools: list[dict] | None, index: int) -> dict:
    extra = {"index": index, "tools": json.dumps(tools) if tools is not None else None}
    return {"data_source": "probe", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": "[]"}, "extra_info": extra}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def box(tokenizer):
    """A toolbox with the run's calculator, read by the hermes parser."""
    tools = load_tools(["posttrain.tools:calculator"])
    made = ToolBox(tools, tool_format=BuiltinFormat(tokenizer, [t.schema for t in tools], "hermes"), timeout_s=10, max_calls=4)
    yield made
    made.close()


@pytest.fixture
def empty_box(tokenizer):
    """No tool of the run's own: every tool comes with its row."""
    made = ToolBox([], tool_format=BuiltinFormat(tokenizer, [], "hermes"), timeout_s=10)
    yield made
    made.close()


def sample(tools: list[dict] | None, source: str = "arithmetic", truth: str = "[]") -> EpisodeSample:
    return EpisodeSample([{"role": "user", "content": "q"}], truth, source, {"tools": json.dumps(tools)} if tools else {})


def test_two_rows_each_see_only_their_own_tools_beside_the_runs(tmp_path, tokenizer, box):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row("Weather in Paris?", WEATHER, 0), row("Price of ACME?", STOCKS, 1), row("2+2?", None, 2)]), path)
    dataset = RLDataset([path], tokenizer, max_prompt_length=4096, tools=box.schemas)
    weather, stocks, plain = (tokenizer.decode(s.prompt_ids) for s in dataset.samples)
    assert "get_weather" in weather and "get_stock_price" not in weather and "get_dividend" not in weather
    assert "get_stock_price" in stocks and "get_dividend" in stocks and "get_weather" not in stocks
    assert all("calculator" in text for text in (weather, stocks, plain))  # the run's tool is told to every row
    assert "get_" not in plain and "tools" not in dataset.samples[2].extra_info
    # the tools travel on with the row, as JSON text
    assert json.loads(dataset.samples[1].extra_info["tools"]) == STOCKS


def test_a_call_to_the_other_rows_tool_is_unknown_tool(tokenizer, empty_box):
    env = ToolEnv(empty_box)
    env.reset(sample(WEATHER))
    result = env.step(call("get_stock_price", ticker="ACME"))
    assert result.info.counts["tool/errors/unknown_tool"] == 1 and not result.done
    assert "get_stock_price" in result.observation and "get_weather" in result.observation  # it is told its tools
    # its own tool is known and its arguments are checked against the row's schema, but nothing here runs it
    checked = empty_box.check(empty_box.read(call("get_weather", city=3), env._row_schemas).calls[0], env._row_tools)
    assert checked.error == "bad_arguments"
    ran = env.step(call("get_weather", city="Paris"))
    assert ran.info.counts["tool/errors/unknown_tool"] == 1 and "no implementation" in ran.observation


def test_a_rows_schema_replaces_the_runs_and_the_runs_implementation_runs_it(tokenizer, box):
    narrowed = {"type": "function", "function": {"name": "calculator", "description": "only sums",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string", "pattern": "^[0-9+ ]+$"}},
                               "required": ["expression"]}}}
    env = ToolEnv(box)
    env.reset(sample([narrowed]))
    assert env.step(call("calculator", expression="6*7")).info.counts["tool/errors/bad_arguments"] == 1
    result = env.step(call("calculator", expression="40 + 2"))
    assert result.info.counts["tool/successes"] == 1 and "42" in result.observation


def test_a_row_without_tools_in_a_run_without_tools_is_refused_but_one_offered_none_is_played(monkeypatch, tmp_path, tokenizer, empty_box):
    with pytest.raises(InputError, match="extra_info.tools"):
        ToolEnv(empty_box).reset(sample(None))
    # four of BFCL's live_irrelevance rows come with an empty function list: the right answer is no call
    monkeypatch.setattr(tool_env, "score_function_for", lambda source: lambda solution_str, ground_truth, extra_info, calls: float(calls == []))
    env = ToolEnv(empty_box, answer="calls")
    offered_none = EpisodeSample([{"role": "user", "content": "q"}], "[]", "arithmetic", {"tools": "[]"})
    path = tmp_path / "rows.parquet"  # and so it reaches the episode from a file, as BFCL's rows do
    pq.write_table(pa.Table.from_pylist([row("Anything?", [], 0), row("2+2?", None, 1)]), path)
    offered, silent = RLDataset([path], tokenizer, max_prompt_length=4096).samples
    assert offered.extra_info["tools"] == "[]" and "tools" not in silent.extra_info
    env.reset(offered_none)
    assert env.step("There is no function I can use for that.").reward == 1.0
    env.reset(offered_none)
    made_up = env.step(call("get_weather", city="Paris"))
    assert made_up.reward == 0.0 and made_up.info.counts["tool/errors/unknown_tool"] == 1


def test_calls_are_the_answer_and_go_to_the_score_function_unrun(monkeypatch, empty_box):
    seen = []

    def score(solution_str, ground_truth, extra_info, calls):
        seen.append(calls)
        return {"score": float(calls == json.loads(ground_truth)), "acc": calls == json.loads(ground_truth)}

    monkeypatch.setattr(tool_env, "score_function_for", lambda source: score)
    truth = json.dumps([{"name": "get_stock_price", "arguments": {"ticker": "ACME"}}, {"name": "get_dividend", "arguments": {"ticker": "ACME"}}])
    env = ToolEnv(empty_box, answer="calls")
    env.reset(sample(STOCKS, truth=truth))
    right = env.step(call("get_stock_price", ticker="ACME") + "\n" + call("get_dividend", ticker="ACME"))
    assert right.done and right.reward == 1.0 and right.info.success
    assert right.info.counts == {"answers": 1, "tool/calls": 2, "tool/successes": 2}
    env.reset(sample(STOCKS, truth=truth))
    wrong = env.step(call("get_weather", city="Paris"))  # not this row's tool: judged (and counted), not run
    assert wrong.done and wrong.reward == 0.0 and wrong.info.counts["tool/errors/unknown_tool"] == 1
    env.reset(sample(STOCKS, truth="[]"))
    none = env.step("None of these functions can help with that.")  # an irrelevance row's right answer
    assert none.reward == 1.0 and seen[-1] == []
    calls_asked = len(seen)
    env.reset(sample(STOCKS, truth=truth))
    broken = env.step('<tool_call>\n{"name": "get_dividend", "arguments": {"ticker": \n</tool_call>')
    assert broken.done and broken.reward == 0.0 and broken.info.counts["tool/errors/bad_json"] == 1
    assert len(seen) == calls_asked  # an unreadable call is scored 0 without asking the function


def test_calls_mode_is_refused_by_name_when_misspelt(empty_box):
    with pytest.raises(InputError, match="answer='call'"):
        ToolEnv(empty_box, answer="call")


def test_sft_transcripts_tell_each_row_its_own_tools(tmp_path, tokenizer):
    path = tmp_path / "sft.parquet"
    rows = [{"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": call("get_weather", city="Paris")}],
             "extra_info": {"tools": json.dumps(WEATHER)}},
            {"messages": [{"role": "user", "content": "Price of ACME?"}, {"role": "assistant", "content": call("get_dividend", ticker="ACME")}],
             "extra_info": {"tools": json.dumps(STOCKS)}}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    weather, stocks = (tokenizer.decode(s.transcript.prompt_ids) for s in SFTDataset([path], tokenizer, max_length=4096).samples)
    assert "get_weather" in weather and "get_dividend" not in weather
    assert "get_dividend" in stocks and "get_weather" not in stocks


def test_a_rows_broken_tools_are_reported_by_file_row_and_field(tmp_path, tokenizer):
    path = tmp_path / "bad.parquet"
    bad = [row("a", None, 0), row("b", None, 1)]
    bad[0]["extra_info"]["tools"] = "[{not json"
    bad[1]["extra_info"]["tools"] = json.dumps([{"type": "function", "function": {"description": "no name"}}])
    pq.write_table(pa.Table.from_pylist(bad), path)
    with pytest.raises(DataFormatError) as error:
        RLDataset([path], tokenizer, max_prompt_length=4096)
    assert f"{path} row 0, extra_info.tools: the row's tools are not JSON" in str(error.value)
    assert f"{path} row 1, extra_info.tools: the row's tool 0 has no name" in str(error.value)


def test_every_row_a_tool_run_cannot_play_is_refused_before_any_worker_starts(tmp_path, tokenizer):
    # a row with no tools in a run with none, 30 minutes into training, once stopped a BFCL run: the
    # rollout now asks ToolEnv's own check of each row, with the run's tools, when it loads the data
    from posttrain.config.schema import PosttrainConfig
    from posttrain.rollout.agent import AgentRollout

    config = PosttrainConfig()
    config.env.name, config.env.options = "tools", {"answer": "calls"}
    path = tmp_path / "rows.parquet"
    scorable = [row("Weather?", WEATHER, 0), row("Anything?", [], 1), row("2+2?", None, 2)]
    pq.write_table(pa.Table.from_pylist([each | {"data_source": "arithmetic"} for each in scorable]), path)
    with pytest.raises(InputError, match=r"^validation prompt 2: env.name=tools needs tools"):
        AgentRollout(config, tokenizer, tmp_path).check_data(training=None, validation=RLDataset([path], tokenizer, max_prompt_length=4096))
    config.env.tools = ["posttrain.tools:calculator"]  # the run's own tool: every row has one
    AgentRollout(config, tokenizer, tmp_path).check_data(validation=RLDataset([path], tokenizer, max_prompt_length=4096))
    pq.write_table(pa.Table.from_pylist(scorable), path)  # data_source 'probe': no score function
    with pytest.raises(InputError, match=r"^training prompt 0: no score function for data_source 'probe'"):
        AgentRollout(config, tokenizer, tmp_path).check_data(training=RLDataset([path], tokenizer, max_prompt_length=4096))
