"""The built-in format (``env.tool_format: builtin``), Hermes-style, for chat templates that ignore
``tools=`` (SmolLM2's, most small models'); read by the ``hermes`` parser.

- the schemas, one JSON object per line inside ``<tools></tools>``, and how to call them, go into the
  system message (after the conversation's own system text, if it has one);
- the model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (several in one turn if it likes), and answers in plain text when it needs no tool;
- results come back in the next user message, one ``<tool_response>`` block per call, in call order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from posttrain.models.tool_formats.base import ParsedByVLLM

BUILTIN_INSTRUCTIONS = (
    "You can use the tools below. To call one, write a JSON object with the tool's name and its arguments "
    'between <tool_call> and </tool_call>, like <tool_call>{{"name": "{example}", "arguments": {{...}}}}</tool_call>. '
    "Each result comes back to you inside <tool_response></tool_response>. When you need no tool, answer directly.\n"
    "<tools>\n{schemas}\n</tools>"
)


def builtin_system_prompt(schemas: Sequence[dict[str, Any]]) -> str:
    """The built-in format's tool instructions (module docstring)."""
    lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return BUILTIN_INSTRUCTIONS.format(example=schemas[0]["function"]["name"] if schemas else "tool", schemas=lines)


def with_system_text(messages: Sequence[dict[str, str]], instructions: str) -> list[dict[str, str]]:
    """``messages`` with ``instructions`` at the end of the system message (one made if there is none)."""
    messages = [dict(m) for m in messages]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = messages[0]["content"].rstrip() + "\n\n" + instructions
        return messages
    return [{"role": "system", "content": instructions}, *messages]


def with_tools(messages: Sequence[dict[str, str]], schemas: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """``messages`` with the built-in format's tool instructions in the system message."""
    return with_system_text(messages, builtin_system_prompt(schemas))


def tool_calls_text(calls: Sequence[dict[str, Any]]) -> str:
    """An assistant turn that makes ``calls`` (``{"name", "arguments"}`` each): one ``<tool_call>`` block per call,
    as scripted experts' transcripts write them."""
    return "\n".join(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>" for call in calls)


def tool_responses(results: Sequence[tuple[str, str]]) -> str:
    """One ``<tool_response>`` block per result, ``(name, text)``."""
    return "\n".join(f"<tool_response>\n{json.dumps({'name': name, 'content': text}, ensure_ascii=False)}\n</tool_response>"
                     for name, text in results)


class BuiltinFormat(ParsedByVLLM):
    name: ClassVar[str] = "builtin"
    observation_role: ClassVar[str] = "user"
    malformed_hint: ClassVar[str] = 'the call could not be read; write <tool_call>{"name": ..., "arguments": {...}}</tool_call> with valid JSON'

    def render_tools(self, conversations: Sequence[Sequence[dict[str, str]]], schemas: Sequence[dict[str, Any]]) -> list[str]:
        return self.tokenizer.apply_chat_template([with_tools(c, schemas) for c in conversations], add_generation_prompt=True, tokenize=False)

    def observation(self, results: Sequence[tuple[str, str]]) -> str:
        return tool_responses(results)
