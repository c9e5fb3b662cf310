"""Tools by name, as ``env.tools`` lists them:

    env.tools:
      - my_tools.py:lookup                 # function lookup in a .py file (path relative to the working directory)
      - posttrain.tools:calculator         # a function in an importable module
      - my_env.py:Warehouse                # a class: its public methods are tools, one instance per episode
      - {schemas: tools.json, module: my_impl.py}   # OpenAI-style schemas, implemented by same-named functions

A function's schema comes from its signature and docstring (schema.py); a schema file holds one
schema or a list of them. A class's tools are its public methods (not ``_private``, not the hooks
``reset``, ``reward``, ``close``, ``call_row_tool`` and ``end_turn``, not class methods or properties),
described like functions without their ``self``, in the order the class defines them; a class with a
``call_row_tool(name, arguments)`` hook runs the rows' own tools instead (:func:`row_tool_class`), and
may have no public methods; the class must be constructible with no arguments
(instances.py runs them, docs/tools.md "Tool classes" is the contract). Loading a tool imports its
module here, to describe it and to fail early; the calls run elsewhere (execute.py), so a tool is held
as a :class:`ToolFunction` or :class:`ToolClass`: a picklable reference (file or module, and name)
that loads the function or class where it is called.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.rewards.custom import import_source
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


# a tool class's methods that the episode calls, never the model: ROW_CALL runs a call to one of the row's
# own tools (a class that has it runs them: docs/tools.md "BFCL multi-turn"), END_TURN ends a user turn
ROW_CALL, END_TURN = "call_row_tool", "end_turn"
HOOKS = ("reset", "reward", "close", ROW_CALL, END_TURN)


@dataclass(frozen=True)
class ToolClass:
    """Class ``name`` of ``source`` (a .py file or a module): one instance per episode, whose public
    methods are tools; results are cut to ``max_chars`` characters in the instance's process."""

    source: str
    name: str
    max_chars: int = 20_000

    def load(self) -> type:
        loaded = _attribute(self.source, self.name)
        if not inspect.isclass(loaded):
            raise ToolSpecError(f"{self.source}:{self.name} is not a class")
        return loaded


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its schema, and what runs it (a function, a method of a tool class's
    per-episode instance, named like the tool, or an MCP server's tool)."""

    schema: dict[str, Any]
    function: ToolFunction | None = None
    mcp_server: int | None = None  # index into env.mcp_servers
    tool_class: ToolClass | None = None

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
                raise ToolSpecError(f"env.tools entry {spec!r}: write FILE.py:FUNCTION, FILE.py:CLASS or module.path:FUNCTION")
            loaded = _attribute(source, name)
            if inspect.isclass(loaded):
                tools += class_tools(loaded, ToolClass(_absolute(source), name, max_chars))
            else:
                function = load_function(source, name)
                tools.append(Tool(function_schema(function, name), ToolFunction(_absolute(source), name, max_chars)))
        elif isinstance(spec, Mapping) and set(spec) == {"schemas", "module"}:
            tools += _schema_file_tools(str(spec["schemas"]), str(spec["module"]), max_chars)
        else:
            raise ToolSpecError(f"env.tools entry {spec!r}: give FILE.py:FUNCTION, FILE.py:CLASS, module:FUNCTION or {{schemas: FILE.json, module: FILE.py}}")
    check_unique(tools)
    return tools


def class_tools(cls: type, reference: ToolClass) -> list[Tool]:
    """One tool per public method of ``cls`` (module docstring), each run on the episode's instance."""
    label = f"tool class {reference.name!r}"
    required = [p.name for p in inspect.signature(cls).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise ToolSpecError(f"{label}: its constructor needs {required}; each episode makes one with no arguments, "
                            "so give them defaults and take the row's values in reset(**row)")
    for hook in HOOKS:
        if hook in dir(cls) and not inspect.isfunction(inspect.getattr_static(cls, hook)):
            raise ToolSpecError(f"{label}: {hook} must be a plain method (def {hook}(self, ...))")
    names = dict.fromkeys(key for klass in reversed(cls.__mro__[:-1]) for key in vars(klass))  # definition order
    tools = []
    for name in names:
        if name.startswith("_") or name in HOOKS:
            continue
        attribute = inspect.getattr_static(cls, name)
        if isinstance(attribute, staticmethod):
            tools.append(Tool(function_schema(attribute.__func__, name), tool_class=reference))
        elif inspect.isfunction(attribute):  # described bound, so that self is not a parameter
            tools.append(Tool(function_schema(types.MethodType(attribute, cls), name), tool_class=reference))
    if not tools and not runs_row_tools(cls):
        raise ToolSpecError(f"{label} has no public methods to be tools (names not starting with _, other than {', '.join(HOOKS)})")
    return tools


def runs_row_tools(cls: type) -> bool:
    """Whether the tool class runs the rows' own tools (it has a ``call_row_tool(name, arguments)`` hook)."""
    return callable(getattr(cls, ROW_CALL, None))


def has_reward(cls: type) -> bool:
    """Whether the tool class scores the episode (it has a ``reward()``; docs/tools.md "Tool classes")."""
    return callable(getattr(cls, "reward", None))


def row_tool_class(specs: Sequence[Any], max_chars: int = 20_000) -> ToolClass | None:
    """The class among ``env.tools`` that runs the rows' own tools, if one does; two are refused."""
    found = []
    for spec in specs:
        source, _, name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
        if source and inspect.isclass(loaded := _attribute(source, name)) and runs_row_tools(loaded):
            found.append(ToolClass(_absolute(source), name, max_chars))
    if len(found) > 1:
        raise ToolSpecError(f"env.tools: {[c.name for c in found]} all run the rows' own tools ({ROW_CALL}); name one")
    return found[0] if found else None


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
    function = _attribute(source, name)
    if inspect.isclass(function):
        raise ToolSpecError(f"{source}:{name} is a class; name it in env.tools as a tool class, not as a function")
    return function


def _attribute(source: str, name: str) -> Any:
    """Function or class ``name`` from ``source``."""
    module = _module(source)
    found = getattr(module, name, None)
    if not callable(found):
        defined = sorted(k for k, v in vars(module).items() if (inspect.isfunction(v) or inspect.isclass(v)) and not k.startswith("_"))
        raise ToolSpecError(f"{source} has no function {name!r} and no class of that name (its functions and classes: {defined})")
    return found


def _module(source: str) -> Any:
    return import_source(source, "posttrain_user_tools_", ToolSpecError, f"tool {'file' if source.endswith('.py') else 'module'} {source!r}")