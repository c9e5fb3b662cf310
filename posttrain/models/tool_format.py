"""The tools a prompt is told: the run's, and a row's own; rendered in the run's tool format
(``env.tool_format``, models/tool_formats/: the chat template's own rendering, the built-in format, or
JSON lines).

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
from posttrain.models.tool_formats import ToolFormat, format_class

ROW_TOOLS_KEY = "tools"  # where a row's own tools travel: extra_info["tools"]


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
    row_tools: Sequence[Sequence[dict[str, Any]] | None] | None = None, tool_format: str | ToolFormat = "auto",
) -> list[str]:
    """Each conversation as prompt text (with the generation prompt), told about ``schemas`` (the run's
    tools) and, with ``row_tools`` (one entry per conversation), that conversation's own tools, in
    ``tool_format`` (a format, or ``env.tool_format``'s name)."""
    if not schemas and (row_tools is None or not any(row_tools)):  # no tools: the chat template alone, whatever the format
        return tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False)
    if isinstance(tool_format, str):
        tool_format = format_class(tool_format, tokenizer)(tokenizer)
    if row_tools is None or not any(row_tools):
        return tool_format.render(conversations, schemas)
    if len(row_tools) != len(conversations):
        raise ValueError(f"{len(row_tools)} rows' tools for {len(conversations)} conversations")
    return [tool_format.render([c], merged_schemas(schemas, own))[0] for c, own in zip(conversations, row_tools)]
