"""How a model is told which tools it has: its own chat template, or posttrain's built-in format.

A chat template that renders ``tools=`` (Qwen, Llama 3.1+, Mistral, Hermes...) is given the schemas
and writes them its own way. A template that ignores them (SmolLM2's, most small models') gets the
**built-in format**, Hermes-style, the one the ``hermes`` tool parser reads:

- the schemas, one JSON object per line inside ``<tools></tools>``, and how to call them, go into the
  system message (after the conversation's own system text, if it has one);
- the model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (several in one turn if it likes), and answers in plain text when it needs no tool;
- results come back in the next user message, one ``<tool_response>`` block per call, in call order.

Whether a template renders tools is found by rendering one with a made-up tool and looking for its name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_PROBE = {"type": "function", "function": {"name": "posttrain_probe_tool_x7", "description": "probe",
                                            "parameters": {"type": "object", "properties": {}}}}

BUILTIN_INSTRUCTIONS = (
    "You can use the tools below. To call one, write a JSON object with the tool's name and its arguments "
    'between <tool_call> and </tool_call>, like <tool_call>{{"name": "{example}", "arguments": {{...}}}}</tool_call>. '
    "Each result comes back to you inside <tool_response></tool_response>. When you need no tool, answer directly.\n"
    "<tools>\n{schemas}\n</tools>"
)


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes the schemas given as ``tools=``."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[_PROBE], tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return _PROBE["function"]["name"] in text


def builtin_system_prompt(schemas: Sequence[dict[str, Any]]) -> str:
    """The built-in format's tool instructions (module docstring)."""
    lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return BUILTIN_INSTRUCTIONS.format(example=schemas[0]["function"]["name"] if schemas else "tool", schemas=lines)


def with_tools(messages: Sequence[dict[str, str]], schemas: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """``messages`` with the built-in format's tool instructions in the system message."""
    messages = [dict(m) for m in messages]
    instructions = builtin_system_prompt(schemas)
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = messages[0]["content"].rstrip() + "\n\n" + instructions
        return messages
    return [{"role": "system", "content": instructions}, *messages]


def render_with_tools(conversations: Sequence[Sequence[dict[str, str]]], tokenizer: Any, schemas: Sequence[dict[str, Any]] | None) -> list[str]:
    """Each conversation as prompt text (with the generation prompt), told about ``schemas`` when given."""
    if not schemas:
        return tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False)
    if template_renders_tools(tokenizer):
        return [tokenizer.apply_chat_template(list(c), tools=list(schemas), add_generation_prompt=True, tokenize=False) for c in conversations]
    return tokenizer.apply_chat_template([with_tools(c, schemas) for c in conversations], add_generation_prompt=True, tokenize=False)


def tool_observation(results: Sequence[tuple[str, str]], native: bool) -> str:
    """The text of the message that carries a turn's results, ``(name, text)`` per call: in the built-in
    format one ``<tool_response>`` block each (the message goes as role user); for a template that
    renders tools, the texts alone (the message goes as role tool, and the template wraps it)."""
    if native:
        return "\n\n".join(text for _, text in results)
    return "\n".join(f"<tool_response>\n{json.dumps({'name': name, 'content': text}, ensure_ascii=False)}\n</tool_response>" for name, text in results)
