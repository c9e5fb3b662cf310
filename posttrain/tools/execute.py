"""Running the calls of a round, so that no call can crash, hang or flood a step.

Every call goes the same way, whether a Python function or an MCP server's tool runs it:

    arguments   the JSON text must parse (at most ``max_argument_chars``, nesting within Python's limit)
                and validate against the tool's schema (``jsonschema``)
    run         Python functions in a child process (``posttrain/deadlines.py ProcessScorer``): each call has
                ``timeout_s``; a call past it, or one that kills its process, has the child replaced
                and the others go on; a tool class's methods on the calling episode's own instance
                (instances.py), with the same deadline: a call past it, or one that kills the episode's
                process, loses that episode's instances (``alive`` turns False), no other's; a call to a
                row's own tool on the episode's instance of the class that runs rows' tools (its
                ``call_row_tool`` hook), if the run has one and no tool of that name; MCP tools
                through the server's session, with the same deadline
    result      text, cut to ``max_chars`` characters where it ran (the environment's renderer then
                cuts the observation to ``env.max_obs_length`` tokens)

A failure is never raised: it becomes a :class:`CallResult` with an ``error`` kind (:data:`ERROR_KINDS`)
and a message the model reads, so it can try again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema

from posttrain.models.tool_format import merged_schemas
from posttrain.models.tool_formats import ParsedCall, ParsedTurn, ToolFormat
from posttrain.models.tool_formats.builtin import BuiltinFormat
from posttrain.deadlines import CallOutcome, ProcessScorer
from posttrain.tools.instances import InstancePool
from posttrain.tools.load import END_TURN, ROW_CALL, Tool, ToolClass, has_reward

# bad_json: unreadable call or arguments; unknown_tool; bad_arguments: against the schema; too_large:
# arguments over the limit; exception: the tool raised; timeout; crashed: the tool's process died;
# over_budget: past the episode's call budget (counted by the environment)
ERROR_KINDS = ("bad_json", "unknown_tool", "bad_arguments", "too_large", "exception", "timeout", "crashed", "over_budget")


# " (file.py:12 in name)" at the end of an exception's description; the name part is an identifier (or
# <module>, <lambda>...), so that a long message made of ":1 in " pieces cannot make this regex quadratic
_WHERE = re.compile(r" \([^()]*:\d+ in [\w<>.]+\)$")
MAX_ERROR_CHARS = 2000  # of an exception's message: a tool may raise with any amount of text


@dataclass(frozen=True)
class CallResult:
    name: str
    text: str                # what the model reads
    error: str | None = None  # one of ERROR_KINDS, or None for a success

    @property
    def ok(self) -> bool:
        return self.error is None


def failed(name: str, kind: str, message: str) -> CallResult:
    return CallResult(name, f"Error ({kind}): {message}", kind)


class McpTools(Protocol):
    """What the toolbox needs of the MCP servers (tools/mcp.py)."""

    def call(self, server: int, name: str, arguments: dict[str, Any], timeout_s: float) -> CallResult: ...

    def close(self) -> None: ...


class ToolBox:
    """The run's tools and the means to call them; one per process that runs agent episodes."""

    def __init__(
        self, tools: Sequence[Tool], *, tool_format: ToolFormat | None = None,
        timeout_s: float = 10.0, max_calls: int = 8, max_argument_chars: int = 100_000, mcp: McpTools | None = None,
        row_class: ToolClass | None = None,
    ) -> None:
        """``tool_format`` reads a turn's calls and writes its results (default: the built-in format, read
        without a tokenizer); ``max_calls``: per episode;
        ``row_class``: the tool class that runs the rows' own tools (``load.row_tool_class``), if one does."""
        self.tools = {tool.name: tool for tool in tools}
        self.format = tool_format or BuiltinFormat(None)
        self.max_calls = max_calls
        self.timeout_s = timeout_s
        self.max_argument_chars = max_argument_chars
        self.mcp = mcp
        self._functions = [tool.function for tool in tools if tool.function is not None]
        self._index = {tool.name: i for i, tool in enumerate(t for t in tools if t.function is not None)}
        self._runner = ProcessScorer(timeout_s)
        self.classes: list[ToolClass] = list(dict.fromkeys([*(tool.tool_class for tool in tools if tool.tool_class is not None),
                                                            *([row_class] if row_class is not None else [])]))
        self._row_runner = self.classes.index(row_class) if row_class is not None else None
        self._turn_enders = [i for i, tool_class in enumerate(self.classes) if callable(getattr(tool_class.load(), END_TURN, None))]
        # the classes whose reward() scores the episode (docs/tools.md "Tool classes")
        self._scoring = [i for i, tool_class in enumerate(self.classes) if has_reward(tool_class.load())]
        self._instances = InstancePool(self.classes, timeout_s) if self.classes else None

    @property
    def scores_episodes(self) -> bool:
        """A tool class has ``reward()``: it, not the row's score function, scores an episode's end."""
        return bool(self._scoring)

    def open_episode(self, fields: Mapping[str, Any]) -> tuple[int | None, CallResult]:
        """A new episode's instances of the tool classes, their ``reset`` given ``fields``: the episode's key
        (None when the run has no tool classes) and its first observation (reset's texts, joined), or the
        error that lost them (:meth:`alive` is then False)."""
        if self._instances is None:
            return None, CallResult("reset", "")
        key, outcome = self._instances.open(fields)
        if outcome.ok:
            return key, CallResult("reset", "\n\n".join(text for text in outcome.value if text))
        return key, _as_result("reset", outcome, self.timeout_s)

    def alive(self, key: int | None) -> bool:
        """Whether the episode's instances still run (always, for an episode without any)."""
        return key is None or self._instances is not None and self._instances.alive(key)

    def episode_reward(self, key: int, answer: str | None) -> list[Any] | CallResult:
        """What each scoring class's ``reward()`` returns for the episode (given ``answer=`` if it takes it), or the first error."""
        outcomes = self._instances.call([(key, i, "reward", {"answer": answer}) for i in self._scoring])
        failure = next((outcome for outcome in outcomes if not outcome.ok), None)
        return [outcome.value for outcome in outcomes] if failure is None else _as_result("reward", failure, self.timeout_s)

    def end_turn(self, key: int | None) -> None:
        """A user turn of the episode has ended (``answer: turns``): each class's ``end_turn()`` runs; one that
        fails or hangs loses the episode's instances like a call would (:meth:`alive`)."""
        if key is not None and self._instances is not None and self._turn_enders:
            self._instances.call([(key, i, END_TURN, {}) for i in self._turn_enders])

    def release(self, key: int | None) -> None:
        """The episode is over: its instances' ``close()`` runs and their process ends."""
        if key is not None and self._instances is not None:
            self._instances.release(key)

    def observation(self, results: Sequence[tuple[str, str]]) -> str:
        """The message text that carries a turn's results (``(name, text)`` per call)."""
        return self.format.observation(results)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def read(self, text: str, row_tools: Sequence[dict[str, Any]] = ()) -> ParsedTurn:
        """The calls in an agent turn; ``row_tools``: the schemas of the row's own tools, if it has any."""
        return self.format.parse(text, merged_schemas(self.schemas, row_tools) if row_tools else None)

    def run(
        self, calls: Sequence[ParsedCall], row_tools: Sequence[Mapping[str, dict[str, Any]]] | None = None,
        episodes: Sequence[int | None] | None = None,
    ) -> list[CallResult]:
        """One result per call, in order (see the module docstring). ``row_tools``: per call, the functions
        of its row's own tools by name (:meth:`check`); a call to one that the run cannot run is ``unknown_tool``.
        ``episodes``: per call, the key of its episode's instances (:meth:`open_episode`), for tool classes' methods."""
        results: list[CallResult | None] = []
        pending: list[tuple[int, dict[str, Any]]] = []  # (position, arguments) of function calls
        methods: list[tuple[int, tuple[int, int, str, dict[str, Any]]]] = []  # (position, request) of tool classes' calls
        for call, own, key in zip(calls, row_tools or [{}] * len(calls), episodes or [None] * len(calls), strict=True):
            checked = self.check(call, own)
            if isinstance(checked, CallResult):
                results.append(checked)
                continue
            tool = self.tools.get(call.name)
            if tool is None and self._row_runner is not None and key is not None:  # the row's tool, on its episode's instance
                results.append(None)
                methods.append((len(results) - 1, (key, self._row_runner, ROW_CALL, {"name": call.name, "arguments": checked})))
            elif tool is None:  # described by its row, run by nothing here
                results.append(failed(call.name, "unknown_tool", f"this run has no implementation of {call.name!r}; the tools that run are {', '.join(self.tools) or 'none'}"))
            elif tool.mcp_server is not None:
                results.append(self._call_mcp(tool, checked))
            elif tool.tool_class is not None:
                if key is None:
                    raise RuntimeError(f"tool {tool.name!r} is a tool class's method: its call needs its episode's key (open_episode)")
                results.append(None)
                methods.append((len(results) - 1, (key, self.classes.index(tool.tool_class), tool.name, checked)))
            else:
                results.append(None)
                pending.append((len(results) - 1, checked))
        if pending:
            outcomes = self._runner.run(self._functions, [(self._index[calls[i].name], arguments) for i, arguments in pending])
            for (i, _), outcome in zip(pending, outcomes, strict=True):
                results[i] = _as_result(calls[i].name, outcome, self.timeout_s)
        if methods:
            outcomes = self._instances.call([request for _, request in methods])
            for (i, _), outcome in zip(methods, outcomes, strict=True):
                results[i] = _as_result(calls[i].name, outcome, self.timeout_s)
        return [result for result in results if result is not None]

    def check(self, call: ParsedCall, row_tools: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any] | CallResult:
        """The call's arguments, or the error that stops it before it runs. ``row_tools``: the functions
        (``{"name", "parameters", ...}``) of the row's own tools by name, which replace the run's of the same name."""
        own = (row_tools or {}).get(call.name)
        tool = self.tools.get(call.name)
        if tool is None and own is None:
            shown = call.name if len(call.name) <= 60 else call.name[:60] + "..."
            names = [*(row_tools or {}), *(name for name in self.tools if name not in (row_tools or {}))]
            return failed(shown, "unknown_tool", f"there is no tool {shown!r}; the tools are {', '.join(names)}")
        parameters = own.get("parameters", {}) if own is not None else tool.parameters
        if len(call.arguments) > self.max_argument_chars:
            return failed(call.name, "too_large", f"the arguments are {len(call.arguments)} characters; at most {self.max_argument_chars}")
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except (ValueError, RecursionError) as error:
            return failed(call.name, "bad_json", f"the arguments are not JSON ({str(error)[:200]})")
        if not isinstance(arguments, dict):
            return failed(call.name, "bad_arguments", "the arguments must be a JSON object of parameter names and values")
        try:
            jsonschema.validate(arguments, parameters)
        except jsonschema.ValidationError as error:
            return failed(call.name, "bad_arguments", error.message[:300])
        except (jsonschema.SchemaError, RecursionError) as error:
            return failed(call.name, "bad_arguments", f"the arguments could not be checked ({type(error).__name__})")
        return arguments

    def _call_mcp(self, tool: Tool, arguments: dict[str, Any]) -> CallResult:
        if self.mcp is None:
            raise RuntimeError(f"tool {tool.name!r} lives on an MCP server, and this toolbox has no MCP connection")
        return self.mcp.call(tool.mcp_server, tool.name, arguments, self.timeout_s)

    def close(self) -> None:
        self._runner.close()
        if self._instances is not None:
            self._instances.close()
        if self.mcp is not None:
            self.mcp.close()


def _as_result(name: str, outcome: CallOutcome, timeout_s: float) -> CallResult:
    """A call's outcome as the model reads it (module docstring)."""
    if outcome.timed_out:
        return failed(name, "timeout", f"the call took longer than {timeout_s:g} s and was stopped")
    if outcome.died:
        return failed(name, "crashed", "the tool's process died during the call")
    if outcome.error:  # the model reads the exception, not where in the tool's source it was raised
        message = _WHERE.sub("", outcome.error)
        cut = f" ...(cut at {MAX_ERROR_CHARS} characters)" if len(message) > MAX_ERROR_CHARS else ""
        return failed(name, "exception", message[:MAX_ERROR_CHARS] + cut)
    return CallResult(name, str(outcome.value))
