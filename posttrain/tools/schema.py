"""A tool's JSON schema, read from a plain Python function's signature and docstring.

The schema is OpenAI's function-tool layout, what chat templates (``tools=``) and tool parsers read:

    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {
        "type": "object", "properties": {...}, "required": [...]}}}

Types map to JSON types: ``str`` → string, ``int`` → integer, ``float`` → number, ``bool`` →
boolean, ``list[X]`` / ``tuple[X, ...]`` → array of X, ``dict[str, X]`` → object, ``Literal[...]`` →
enum, ``X | None`` / ``Optional[X]`` → X (null allowed). Parameters without a default are required.
The description is the docstring's text before its sections; each parameter's description comes
from its ``Args:`` entry (Google style; NumPy and reST docstrings are read too). A function that
cannot be described — a parameter without a type hint, ``*args``/``**kwargs``, a type with no JSON
form — is refused with :class:`ToolSpecError` naming the parameter.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

import docstring_parser
from posttrain.errors import InputError

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolSpecError(InputError):
    """A tool that cannot be loaded or described; the message names the tool and the fix."""


def function_schema(function: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI-style schema of ``function`` (named ``name``, default its own name)."""
    name = name or function.__name__
    try:
        hints = typing.get_type_hints(function)
    except Exception as error:  # a hint naming something undefined
        raise ToolSpecError(f"tool {name!r}: its type hints cannot be read ({type(error).__name__}: {error})") from None
    docs = docstring_parser.parse(inspect.getdoc(function) or "")
    described = {param.arg_name: param.description or "" for param in docs.params}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolSpecError(f"tool {name!r}: *{parameter.name} / **{parameter.name} cannot be described to a model; name each parameter")
        if parameter.name not in hints:
            raise ToolSpecError(f"tool {name!r}: parameter {parameter.name!r} has no type hint; annotate it (e.g. `{parameter.name}: str`)")
        try:
            schema = json_type(hints[parameter.name])
        except ToolSpecError as error:
            raise ToolSpecError(f"tool {name!r}: parameter {parameter.name!r}: {error}") from None
        if described.get(parameter.name):
            schema["description"] = described[parameter.name]
        properties[parameter.name] = schema
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    description = "\n\n".join(part for part in (docs.short_description, docs.long_description) if part)
    if not description:
        raise ToolSpecError(f"tool {name!r} has no docstring; the model reads it to know what the tool does, so write one")
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def json_type(hint: Any) -> dict[str, Any]:
    """The JSON schema of one type hint; :class:`ToolSpecError` when it has none."""
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        kinds = {_SCALARS.get(type(value)) for value in arguments}
        if None in kinds or len(kinds) != 1:
            raise ToolSpecError(f"Literal{list(arguments)} must list values of one JSON type (str, int, float or bool)")
        return {"type": kinds.pop(), "enum": list(arguments)}
    if origin in (Union, types.UnionType):
        rest = [argument for argument in arguments if argument is not type(None)]
        if len(rest) != 1:
            raise ToolSpecError(f"{hint} is a union of several types; use one type (optionally `| None`)")
        schema = json_type(rest[0])
        if len(rest) < len(arguments):
            schema["type"] = [schema["type"], "null"] if isinstance(schema.get("type"), str) else schema.get("type")
        return schema
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        if origin is tuple and not (len(arguments) == 2 and arguments[1] is Ellipsis):
            raise ToolSpecError(f"{hint}: write a fixed-length tuple as list[X] or tuple[X, ...]")
        return {"type": "array", "items": json_type(arguments[0])} if arguments else {"type": "array"}
    if origin is dict or hint is dict:
        if arguments and arguments[0] is not str:
            raise ToolSpecError(f"{hint}: JSON objects have str keys; use dict[str, X]")
        return {"type": "object", "additionalProperties": json_type(arguments[1])} if arguments else {"type": "object"}
    raise ToolSpecError(f"{hint!r} has no JSON form; use str, int, float, bool, list[...], dict[str, ...], Literal[...] or X | None")


def check_schema(schema: Any, source: str) -> dict[str, Any]:
    """An OpenAI-style tool schema given as data, checked; :class:`ToolSpecError` says what is missing."""
    function = schema.get("function") if isinstance(schema, dict) and schema.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ToolSpecError(
            f"{source}: {str(schema)[:120]} is not a tool schema; write "
            '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}'
        )
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolSpecError(f"{source}: tool {function['name']!r}: parameters must be a JSON schema of type object")
    return {"type": "function", "function": {**function, "parameters": parameters}}
