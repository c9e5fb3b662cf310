"""Tool formats: how a model is told its tools, how it writes a call, how results come back (base.py).

    builtin.py    Hermes-style ``<tool_call>`` blocks in a system prompt of posttrain's (SmolLM2 and other
                  templates that ignore ``tools=``)
    template.py   the chat template's own rendering of ``tools=``, read by a vLLM tool parser
    jsonl.py      one JSON object per line, for any template
    parsers.py    vLLM's tool-call parsers (and a hermes reader without vLLM), for builtin and template

``env.tool_format: auto`` (the default) is ``template`` where the chat template renders tools, else
``builtin``. Adding a format is one file here: a :class:`ToolFormat` subclass with a ``name``; every
module of this package is imported with it, so its class registers itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

from posttrain.errors import InputError
from posttrain.models.tool_formats.base import FORMATS, ToolFormat
from posttrain.models.tool_formats.parsers import CallParser, ParsedCall, ParsedTurn, auto_parser_name, parser_names
from posttrain.models.tool_formats.template import template_renders_tools

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def format_names() -> list[str]:
    return sorted(FORMATS)


def format_class(name: str, tokenizer: Any) -> type[ToolFormat]:
    """The class ``env.tool_format`` names; ``auto``: ``template`` where ``tokenizer``'s chat template
    renders tools, else ``builtin``."""
    if name == "auto":
        name = "template" if tokenizer is not None and template_renders_tools(tokenizer) else "builtin"
    if name not in FORMATS:
        raise InputError(f"env.tool_format={name!r} is not a tool format; use auto or one of {', '.join(format_names())}")
    return FORMATS[name]


def make_tool_format(name: str, tokenizer: Any, schemas: Sequence[dict[str, Any]] = (), parser: str = "auto") -> ToolFormat:
    """The run's format: ``env.tool_format`` (``name``) for ``tokenizer``, the run's tools and ``env.tool_parser``."""
    return format_class(name, tokenizer)(tokenizer, schemas, parser)


__all__ = [
    "FORMATS", "CallParser", "ParsedCall", "ParsedTurn", "ToolFormat", "auto_parser_name", "format_class", "format_names",
    "make_tool_format", "parser_names", "template_renders_tools",
]
