"""Reading a turn's tool calls: vLLM's hermes parser with SmolLM2's tokenizer, and the fallback without one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from posttrain.models.tool_formats import CallParser, ParsedCall, auto_parser_name

SCHEMAS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate.", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]


def tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


ONE = "Let me compute it.\n" + tool_call("calculator", {"expression": "2 + 2"})
TWO = tool_call("search", {"query": "Ada Lovelace"}) + "\n" + tool_call("calculator", {"expression": "1815 + 36"})
BROKEN = 'Checking.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}\n</tool_call>'
UNCLOSED = tool_call("calculator", {"expression": "3 * 3"}).removesuffix("\n</tool_call>")  # generation stopped early
PLAIN = "The answer is 4."


@pytest.fixture(scope="module")
def smollm2():
    from posttrain.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def hermes(smollm2):
    parser = CallParser("hermes", smollm2, SCHEMAS)
    assert parser._vllm is not None  # vLLM's own parser reads these, not the fallback
    return parser


@pytest.fixture(scope="module")
def fallback():
    parser = CallParser("hermes", None, SCHEMAS)
    assert parser._vllm is None
    return parser


@pytest.fixture(params=["vllm", "fallback"])
def parser(request, hermes, fallback):
    """Each check runs against both readers: they must agree on these turns."""
    return hermes if request.param == "vllm" else fallback


def arguments(call: ParsedCall) -> dict:
    return json.loads(call.arguments)


def test_one_call(parser):
    turn = parser(ONE)
    assert [call.name for call in turn.calls] == ["calculator"]
    assert arguments(turn.calls[0]) == {"expression": "2 + 2"}
    assert turn.content.strip() == "Let me compute it."
    assert turn.malformed == 0 and not turn.is_final


def test_two_calls_in_one_turn_keep_their_order(parser):
    turn = parser(TWO)
    assert [call.name for call in turn.calls] == ["search", "calculator"]
    assert [arguments(call) for call in turn.calls] == [{"query": "Ada Lovelace"}, {"expression": "1815 + 36"}]
    assert turn.content.strip() == "" and turn.malformed == 0


def test_broken_json_is_a_malformed_call_not_an_answer(parser):
    """A call the parser cannot read counts as malformed, so the turn is not taken as the final answer."""
    turn = parser(BROKEN)
    assert turn.calls == [] and turn.malformed == 1
    assert not turn.is_final


def test_a_call_cut_off_before_its_closing_tag_is_still_read(parser):
    turn = parser(UNCLOSED)
    assert [(call.name, arguments(call)) for call in turn.calls] == [("calculator", {"expression": "3 * 3"})]
    assert turn.malformed == 0


def test_a_call_marker_alone_is_malformed(parser):
    turn = parser("I would write <tool_call> here")
    assert turn.calls == [] and turn.malformed == 1 and not turn.is_final


def test_plain_text_is_final(parser):
    turn = parser(PLAIN)
    assert turn.calls == [] and turn.malformed == 0 and turn.is_final
    assert turn.content == PLAIN


@pytest.mark.parametrize("text", [ONE, TWO, BROKEN, UNCLOSED, PLAIN, "I would write <tool_call> here"])
def test_fallback_agrees_with_vllm(hermes, fallback, text):
    """Without a tokenizer the same calls, malformed count and finality come out as with vLLM's parser."""
    ours, theirs = fallback(text), hermes(text)
    assert ours.calls == theirs.calls
    assert (ours.malformed, ours.is_final) == (theirs.malformed, theirs.is_final)


def test_auto_parser_name_for_smollm2_is_hermes(smollm2):
    """SmolLM2's template has no tool support, so the built-in (hermes-style) format is used."""
    assert "tools" not in smollm2.chat_template
    assert auto_parser_name(smollm2) == "hermes"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for tool in tools %}<tools>{{ tool }}</tools>{% endfor %}<tool_call>", "hermes"),
        ("{% if tools %}<|python_tag|>{{ tools }}{% endif %}", "llama3_json"),
        ("{% if tools %}{{ tools }} ipython{% endif %}", "llama3_json"),
    ],
)
def test_auto_parser_name_reads_the_template(template, expected):
    assert auto_parser_name(SimpleNamespace(chat_template=template)) == expected


def test_auto_parser_name_refuses_a_template_it_cannot_place():
    with pytest.raises(ValueError, match="env.tool_parser"):
        auto_parser_name(SimpleNamespace(chat_template="{% for tool in tools %}[TOOLS]{{ tool }}{% endfor %}"))


def test_unknown_parser_name_lists_the_parsers(smollm2):
    with pytest.raises(ValueError, match=r"'no_such_format' is not one of vLLM's tool parsers \(.*hermes.*\)") as error:
        CallParser("no_such_format", smollm2, SCHEMAS)
    assert "llama3_json" in str(error.value) and "pythonic" in str(error.value)
