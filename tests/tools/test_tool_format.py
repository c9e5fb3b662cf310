"""Telling a model about its tools: the built-in format for SmolLM2's template, a template's own rendering
otherwise, and the observation that carries results back."""

from __future__ import annotations

import copy
import json
import re

import pytest

from posttrain.models.tool_format import render_with_tools
from posttrain.models.tool_formats import template_renders_tools
from posttrain.models.tool_formats.builtin import BuiltinFormat, builtin_system_prompt, with_tools
from posttrain.models.tool_formats.template import TemplateFormat

SCHEMAS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look up a word — in any language.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
]
USER_ONLY = [{"role": "user", "content": "What is 17 * 23?"}]
WITH_SYSTEM = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Define 'ubiquitous'."}]

# renders tools its own way: one line naming them before the conversation
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for tool in tools %} {{ tool.function.name }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def smollm2():
    from posttrain.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def tool_tokenizer(smollm2):
    tokenizer = copy.deepcopy(smollm2)
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def system_block(text: str) -> str:
    """The first system message's content in ChatML text."""
    match = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", text, re.DOTALL)
    assert match, text[:200]
    return match.group(1)


def test_smollm2_template_does_not_render_tools(smollm2):
    assert template_renders_tools(smollm2) is False


def test_a_template_that_loops_over_tools_is_detected(tool_tokenizer, smollm2):
    assert template_renders_tools(tool_tokenizer) is True
    assert smollm2.chat_template != TOOL_TEMPLATE  # the copy was changed, not the cached tokenizer


def test_a_template_that_fails_with_tools_does_not_render_them(smollm2):
    tokenizer = copy.deepcopy(smollm2)
    tokenizer.chat_template = "{{ raise_exception('no tools here') }}"
    assert template_renders_tools(tokenizer) is False


def test_builtin_format_puts_instructions_and_every_schema_in_a_new_system_message(smollm2):
    """Without a system message one is added, holding the instructions and each schema as one JSON line."""
    (text,) = render_with_tools([USER_ONLY], smollm2, SCHEMAS)
    system = system_block(text)
    assert system == builtin_system_prompt(SCHEMAS)
    assert system.startswith("You can use the tools below.")
    assert '<tool_call>{"name": "calculator", "arguments": {...}}</tool_call>' in system  # the first tool as example
    lines = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in lines] == SCHEMAS
    assert "named SmolLM" not in text  # the template's default system text is replaced
    assert "<|im_start|>user\nWhat is 17 * 23?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_builtin_format_appends_to_an_existing_system_message(smollm2):
    (text,) = render_with_tools([WITH_SYSTEM], smollm2, SCHEMAS)
    system = system_block(text)
    assert system.startswith("Be brief.\n\nYou can use the tools below.")
    assert system.count("<|im_start|>") == 0 and text.count("<|im_start|>system") == 1
    assert all(json.dumps(schema, ensure_ascii=False) in system for schema in SCHEMAS)
    assert "<|im_start|>user\nDefine 'ubiquitous'.<|im_end|>" in text


def test_several_conversations_each_get_the_tools(smollm2):
    texts = render_with_tools([USER_ONLY, WITH_SYSTEM], smollm2, SCHEMAS)
    assert len(texts) == 2 and all("<tools>" in system_block(text) for text in texts)
    assert "17 * 23" in texts[0] and "ubiquitous" in texts[1]


def test_without_schemas_the_conversation_is_rendered_as_it_is(smollm2):
    (text,) = render_with_tools([USER_ONLY], smollm2, None)
    assert text == smollm2.apply_chat_template(USER_ONLY, add_generation_prompt=True, tokenize=False)
    assert "<tools>" not in text and "named SmolLM" in text


def test_with_tools_leaves_the_messages_it_was_given(smollm2):
    messages = copy.deepcopy(WITH_SYSTEM)
    told = with_tools(messages, SCHEMAS)
    assert messages == WITH_SYSTEM and told[0]["content"] != WITH_SYSTEM[0]["content"]
    assert [m["role"] for m in with_tools(USER_ONLY, SCHEMAS)] == ["system", "user"]


def test_a_template_that_renders_tools_is_given_them(tool_tokenizer):
    """Its own rendering is used, and the built-in instructions are not added."""
    (text,) = render_with_tools([WITH_SYSTEM], tool_tokenizer, SCHEMAS)
    assert text == tool_tokenizer.apply_chat_template(WITH_SYSTEM, tools=SCHEMAS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nTOOLS: calculator lookup<|im_end|>")
    assert "<tools>" not in text and "You can use the tools below" not in text
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text


def test_builtin_observation_has_one_response_block_per_result_in_order():
    results = [("calculator", "391"), ("lookup", 'said "hi"\nline two, ünïcode'), ("calculator", "Error (timeout): stopped")]
    text = BuiltinFormat(None).observation(results)
    blocks = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
    assert [json.loads(block) for block in blocks] == [{"name": name, "content": content} for name, content in results]
    assert text.count("<tool_response>") == 3 and text.count("</tool_response>") == 3


def test_native_observation_is_the_texts_alone():
    """A template that renders tools wraps the tool message itself: only the texts, in order."""
    text = TemplateFormat(None).observation([("calculator", "391"), ("lookup", "a word")])
    assert text == "391\n\na word" and "<tool_response>" not in text
