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

**Tools per row.** A dataset row may bring its own tools (a ``tools`` column, or ``extra_info.tools``):
OpenAI tool schemas, as a list or as JSON text (:func:`row_schemas`). That row's prompt is told the
run's tools (``env.tools``) followed by its own (:func:`merged_schemas`); a row's tool with the name of a
run's tool replaces that one's schema for the row (the run's implementation still runs it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from posttrain.errors import InputError

ROW_TOOLS_KEY = "tools"  # where a row's own tools travel: extra_info["tools"]
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


def row_schemas(value: Any) -> list[dict[str, Any]]:
    """A row's own tools as OpenAI tool schemas (``{"type": "function", "function": {...}}``).

    ``value`` is a list of schemas or its JSON text (rows' schemas differ, so Parquet keeps them as
    text); a bare function (``{"name", "parameters"}``) is wrapped; ``None`` or ``""`` is no tools.
    Anything else is an :class:`InputError` saying what is wrong.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise InputError(f"the row's tools are not JSON ({str(error)[:200]})") from None
    if not isinstance(value, (list, tuple)):
        raise InputError(f"the row's tools are a {type(value).__name__}; give a list of OpenAI tool schemas")
    schemas = []
    for index, item in enumerate(value):
        function = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InputError(f"the row's tool {index} has no name; each is {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}")
        if not isinstance(function.get("parameters", {}), dict):
            raise InputError(f"the row's tool {function['name']!r} has parameters that are not a JSON Schema object")
        schemas.append({"type": "function", "function": dict(function)})
    return schemas


def merged_schemas(run: Sequence[dict[str, Any]] | None, row: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The run's tools then the row's; a row's tool replaces the run's tool of the same name."""
    own = {schema["function"]["name"] for schema in row or ()}
    return [schema for schema in run or () if schema["function"]["name"] not in own] + list(row or ())


def render_with_tools(
    conversations: Sequence[Sequence[dict[str, str]]], tokenizer: Any, schemas: Sequence[dict[str, Any]] | None,
    row_tools: Sequence[Sequence[dict[str, Any]] | None] | None = None,
) -> list[str]:
    """Each conversation as prompt text (with the generation prompt), told about ``schemas`` (the run's
    tools) and, with ``row_tools`` (one entry per conversation), that conversation's own tools."""
    if row_tools is None or not any(row_tools):
        return _render(conversations, tokenizer, schemas)
    if len(row_tools) != len(conversations):
        raise ValueError(f"{len(row_tools)} rows' tools for {len(conversations)} conversations")
    native = template_renders_tools(tokenizer)
    return [_render([c], tokenizer, merged_schemas(schemas, own), native)[0] for c, own in zip(conversations, row_tools)]


def _render(conversations: Sequence[Sequence[dict[str, str]]], tokenizer: Any, schemas: Sequence[dict[str, Any]] | None,
            native: bool | None = None) -> list[str]:
    if not schemas:
        return tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False)
    if template_renders_tools(tokenizer) if native is None else native:
        return [tokenizer.apply_chat_template(list(c), tools=list(schemas), add_generation_prompt=True, tokenize=False) for c in conversations]
    return tokenizer.apply_chat_template([with_tools(c, schemas) for c in conversations], add_generation_prompt=True, tokenize=False)


def tool_observation(results: Sequence[tuple[str, str]], native: bool) -> str:
    """The text of the message that carries a turn's results, ``(name, text)`` per call: in the built-in
    format one ``<tool_response>`` block each (the message goes as role user); for a template that
    renders tools, the texts alone (the message goes as role tool, and the template wraps it)."""
    if native:
        return "\n\n".join(text for _, text in results)
    return "\n".join(f"<tool_response>\n{json.dumps({'name': name, 'content': text}, ensure_ascii=False)}\n</tool_response>" for name, text in results)
