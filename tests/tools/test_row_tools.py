"""Tools per row: each row's prompt is told its own tools (beside the run's), its calls are checked
against them, and a call to a tool it does not have is ``unknown_tool``. (Where the calls are the
answer, ``answer: calls``: tests/rollout/test_calls.py.)"""

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


def test_a_row_without_tools_in_a_run_without_tools_is_refused(empty_box):
    with pytest.raises(InputError, match="extra_info.tools"):
        ToolEnv(empty_box).reset(sample(None))


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
