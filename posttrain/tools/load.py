"""Tools by name, as ``env.tools`` lists them:

    env.tools:
      - my_tools.py:lookup                 # function lookup in a .py file (path relative to the working directory)
      - posttrain.tools:calculator         # a function in an importable module
      - {schemas: tools.json, module: my_impl.py}   # OpenAI-style schemas, implemented by same-named functions

A function's schema comes from its signature and docstring (schema.py); a schema file holds one
schema or a list of them. Loading a tool imports its module here, to describe it and to fail early;
the calls run elsewhere (execute.py), so a tool is held as a :class:`ToolFunction`: a picklable
reference (file or module, and name) that loads the function where it is called.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.rewards.custom import load_source_file
from posttrain.tools.schema import ToolSpecError, check_schema, function_schema

@dataclass(frozen=True)
class ToolFunction:
    """Function ``name`` of ``source`` (a .py file or a module), called with a tool call's arguments.

    The result comes back as text cut to ``max_chars`` characters (in the process that ran it, so a
    huge result never crosses a pipe): a str as it is (invalid UTF-8 replaced), bytes decoded as UTF-8
    with replacement, anything else as JSON. Coroutine functions are run to completion.
    """

    source: str
    name: str
    max_chars: int = 20_000

    def load(self) -> Callable[..., Any]:
        return load_function(self.source, self.name)

    def __call__(self, **arguments: Any) -> str:
        result = self.load()(**arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return as_text(result, self.max_chars)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its schema, and what runs it (a function, or an MCP server's tool)."""

    schema: dict[str, Any]
    function: ToolFunction | None = None
    mcp_server: int | None = None  # index into env.mcp_servers

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]


def as_text(value: Any, max_chars: int) -> str:
    """A tool's result as text for the model, at most ``max_chars`` characters (cut ones end in a note)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value[: max_chars * 4]).decode("utf-8", errors="replace")
    elif isinstance(value, str):
        text = value[: max_chars + 1].encode("utf-8", errors="replace").decode("utf-8")
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    text = text.replace("\x00", "")
    return text if len(text) <= max_chars else text[:max_chars] + f" ...(cut at {max_chars} characters)"


def load_tools(specs: Sequence[Any], max_chars: int = 20_000) -> list[Tool]:
    """The tools ``specs`` name (see the module docstring); :class:`ToolSpecError` for one that is not there."""
    tools: list[Tool] = []
    for spec in specs:
        if isinstance(spec, str):
            source, _, name = spec.rpartition(":")
            if not source or not name:
                raise ToolSpecError(f"env.tools entry {spec!r}: write FILE.py:FUNCTION or module.path:FUNCTION")
            function = load_function(source, name)
            tools.append(Tool(function_schema(function, name), ToolFunction(_absolute(source), name, max_chars)))
        elif isinstance(spec, Mapping) and set(spec) == {"schemas", "module"}:
            tools += _schema_file_tools(str(spec["schemas"]), str(spec["module"]), max_chars)
        else:
            raise ToolSpecError(f"env.tools entry {spec!r}: give FILE.py:FUNCTION, module:FUNCTION or {{schemas: FILE.json, module: FILE.py}}")
    check_unique(tools)
    return tools


def _schema_file_tools(schemas: str, module: str, max_chars: int) -> list[Tool]:
    path = Path(schemas)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ToolSpecError(f"env.tools schemas {schemas!r}: cannot read it as JSON ({error})") from None
    tools = []
    for schema in data if isinstance(data, list) else [data]:
        checked = check_schema(schema, schemas)
        name = checked["function"]["name"]
        load_function(module, name)  # the implementation must exist
        tools.append(Tool(checked, ToolFunction(_absolute(module), name, max_chars)))
    return tools


def _absolute(source: str) -> str:
    """A .py path made absolute, so the processes that call the tool find it from any directory."""
    return str(Path(source).expanduser().resolve()) if source.endswith(".py") else source


def check_unique(tools: Sequence[Tool]) -> None:
    names = [tool.name for tool in tools]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolSpecError(f"tools {repeated} are given more than once; each tool name must be unique")


def load_function(source: str, name: str) -> Callable[..., Any]:
    """Function ``name`` from ``source``: a .py file, or an importable module."""
    module = _module(source)
    function = getattr(module, name, None)
    if not callable(function):
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise ToolSpecError(f"{source} has no function {name!r} (its functions: {defined})")
    return function


def _module(source: str) -> Any:
    if not source.endswith(".py"):
        try:
            return importlib.import_module(source)
        except ImportError as error:
            raise ToolSpecError(f"tool module {source!r} cannot be imported ({error}); give a .py file or an importable module") from None
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise ToolSpecError(f"tool file {source!r}: no such file (looked at {path})")
    try:
        return load_source_file(path, "posttrain_user_tools_")
    except Exception as error:
        raise ToolSpecError(f"running tool file {source!r} failed: {type(error).__name__}: {error}") from None
