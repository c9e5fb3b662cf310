"""Tools that MCP servers offer, as ``env.mcp_servers`` lists them, called over stdio:

    env.mcp_servers:
      - {command: [npx, -y, "@modelcontextprotocol/server-filesystem", /data]}
      - {command: [python, my_server.py], env: {API_KEY: "..."}}

:class:`McpServers` starts every server as a child process (the ``mcp`` SDK's stdio client), initialises
its session and lists its tools; each becomes a :class:`Tool` whose schema is the tool's name,
description (its name where it has none) and input schema. The sessions live on an event loop in a
daemon thread of their own, so the rest of the program calls :meth:`McpServers.call` synchronously,
as :class:`~posttrain.tools.ToolBox` does after it has checked the arguments against the schema.

A call returns its text content joined by newlines (other content named, as ``[image]``), cut to
``max_chars`` characters; a failure is never raised but returned as an error :class:`CallResult`:
``exception`` (the tool reported an error, or the server refused the call), ``timeout`` (past the
deadline; the server is asked to cancel it) or ``crashed`` (the server's process is gone).

A server that cannot start (no such program, exits, no answer to ``initialize`` within
``start_timeout_s``) raises :class:`ToolSpecError` naming its command, the reason and the end of its
stderr, after stopping the ones already started. Not done: restarting a crashed server (its later
calls fail as ``crashed``), transports other than stdio, resources, prompts, or following a server's
changes to its tool list. A server's environment is the SDK's small inherited set (HOME, LOGNAME,
PATH, SHELL, TERM, USER) with the entry's ``env`` over it; its stderr is passed on to ours.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import mcp_types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from posttrain.tools.execute import CallResult, failed
from posttrain.tools.load import Tool, as_text, check_unique
from posttrain.tools.schema import ToolSpecError, check_schema

_GRACE_S = 5.0  # past a call's deadline, how long the SDK's own timeout is given before the call is abandoned
_STOP_S = 10.0  # for all servers to stop (the SDK closes stdin, then sends SIGTERM and SIGKILL)


@dataclass
class _Server:
    command: list[str]
    started: concurrent.futures.Future[tuple[ClientSession, list[mcp_types.Tool]]] = field(default_factory=concurrent.futures.Future)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=20))  # its last lines
    pump: threading.Thread | None = None  # reads them
    done: concurrent.futures.Future[None] | None = None


class McpServers:
    """The servers ``specs`` (``env.mcp_servers``) list, started and initialised; ``close`` stops them."""

    def __init__(self, specs: Sequence[Any], *, max_chars: int = 20_000, start_timeout_s: float = 30.0) -> None:
        parameters = [_parameters(spec, i) for i, spec in enumerate(specs)]
        self.max_chars = max_chars
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-servers", daemon=True)
        self._thread.start()
        self._servers = [_Server([p.command, *p.args]) for p in parameters]
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, self._servers)
        self._sessions: list[ClientSession] = []
        self._tools: list[Tool] = []
        for server, params in zip(self._servers, parameters, strict=True):
            server.done = asyncio.run_coroutine_threadsafe(_serve(server, params, start_timeout_s), self._loop)
        try:
            for i, server in enumerate(self._servers):
                try:
                    session, listed = server.started.result(start_timeout_s + _STOP_S)
                except Exception as error:  # noqa: BLE001 - whatever stopped the start is told in the message
                    self.close()  # first, so that the server's stderr is all read
                    raise ToolSpecError(f"MCP server env.mcp_servers[{i}] {server.command}: {_reason(error, start_timeout_s, server)}") from None
                self._sessions.append(session)
                self._tools += [Tool(_schema(tool, f"env.mcp_servers[{i}]"), mcp_server=i) for tool in listed]
            check_unique(self._tools)
        except BaseException:
            self.close()
            raise

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def call(self, server: int, name: str, arguments: dict[str, Any], timeout_s: float) -> CallResult:
        """Tool ``name`` of server ``server`` (an index into the specs) run with ``arguments``; never raises."""
        if not self._finalizer.alive:
            return failed(name, "crashed", "the MCP servers have been stopped")
        coroutine = self._sessions[server].call_tool(name, arguments, read_timeout_seconds=timeout_s)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            result = future.result(timeout_s + _GRACE_S)
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:
                return failed(name, "timeout", f"the call took longer than {timeout_s:g} s and was cancelled")
            if error.code == CONNECTION_CLOSED:
                return failed(name, "crashed", "the tool's MCP server has exited or its connection broke")
            return failed(name, "exception", as_text(error.message, self.max_chars))
        except TimeoutError:
            future.cancel()
            return failed(name, "timeout", f"the call took longer than {timeout_s:g} s and was abandoned")
        except Exception as error:  # noqa: BLE001 - a malformed result, the loop stopped under the call: never raised
            return failed(name, "exception", as_text(f"{type(error).__name__}: {error}", self.max_chars))
        text = as_text(_text(result), self.max_chars)
        return failed(name, "exception", text) if result.is_error else CallResult(name, text)

    def close(self) -> None:
        """Stops the sessions, the server processes and the thread; again is a no-op."""
        self._finalizer()


def _parameters(spec: Any, i: int) -> StdioServerParameters:
    where = f"env.mcp_servers[{i}]"
    if not isinstance(spec, Mapping) or "command" not in spec or not set(spec) <= {"command", "env"}:
        raise ToolSpecError(f"{where} = {spec!r}: give {{command: [program, arg, ...], env: {{NAME: value, ...}}}} (env optional)")
    command, env = spec["command"], spec.get("env") or {}
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence) or not command or not all(isinstance(part, str) for part in command):
        raise ToolSpecError(f"{where}.command = {command!r}: give a non-empty list of strings, the program first, e.g. [python, server.py]")
    if not isinstance(env, Mapping) or not all(isinstance(key, str) for key in env):
        raise ToolSpecError(f"{where}.env = {env!r}: give a mapping of environment variable names to values")
    return StdioServerParameters(command=command[0], args=list(command[1:]), env={key: str(value) for key, value in env.items()})


async def _serve(server: _Server, params: StdioServerParameters, start_timeout_s: float) -> None:
    """Runs one server's session from start to ``server.stop`` (the SDK's contexts stay in this task)."""
    errlog, server.pump = _stderr_pipe(server.stderr)
    try:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            errlog.close()  # the server holds its own copy; ours would keep the pipe open after it exits
            with anyio.fail_after(start_timeout_s):
                await session.initialize()
                listed = await session.list_tools()
                tools = list(listed.tools)
                while listed.next_cursor:
                    listed = await session.list_tools(params=mcp_types.PaginatedRequestParams(cursor=listed.next_cursor))
                    tools += listed.tools
            server.started.set_result((session, tools))
            await server.stop.wait()
    except Exception as error:  # noqa: BLE001 - a failed start goes to the constructor; a failed stop is moot
        if not server.started.done():
            server.started.set_exception(error)
    finally:
        errlog.close()


def _stderr_pipe(tail: deque[str]) -> tuple[TextIO, threading.Thread]:
    """The write end of a pipe for a server's stderr; a thread passes its lines on to ours, keeping the last in ``tail``."""
    read_fd, write_fd = os.pipe()

    def pump() -> None:
        with open(read_fd, "rb") as pipe:
            for line in pipe:
                tail.append(line.decode("utf-8", errors="replace"))
                try:
                    sys.stderr.write(tail[-1])
                except (ValueError, OSError):  # our stderr closed (interpreter exit, a test's capture)
                    pass

    thread = threading.Thread(target=pump, name="mcp-server-stderr", daemon=True)
    thread.start()
    return open(write_fd, "w"), thread


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, servers: list[_Server]) -> None:
    for server in servers:
        loop.call_soon_threadsafe(server.stop.set)
    running = [server.done for server in servers if server.done is not None]
    if concurrent.futures.wait(running, timeout=_STOP_S).not_done:
        for future in running:
            future.cancel()  # stuck on start: its task is cancelled, and the SDK still stops the process
        concurrent.futures.wait(running, timeout=_STOP_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(_STOP_S)
    if not thread.is_alive():
        loop.close()


def _schema(tool: mcp_types.Tool, source: str) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description or tool.name, "parameters": tool.input_schema}
    return check_schema({"type": "function", "function": function}, source)


def _text(result: mcp_types.CallToolResult) -> str:
    if not result.content and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(_content_text(item) for item in result.content)


def _content_text(item: mcp_types.ContentBlock) -> str:
    if isinstance(item, mcp_types.TextContent):
        return item.text
    if isinstance(item, mcp_types.EmbeddedResource):
        resource = item.resource
        return resource.text if isinstance(resource, mcp_types.TextResourceContents) else f"[resource {resource.uri}]"
    if isinstance(item, mcp_types.ResourceLink):
        return f"[resource link {item.uri}]"
    return f"[{item.type}]"  # image, audio


def _reason(error: BaseException, start_timeout_s: float, server: _Server) -> str:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, TimeoutError):
        reason = f"no answer to initialize within {start_timeout_s:g} s"
    elif isinstance(error, OSError):
        reason = f"cannot run it ({error})"
    elif isinstance(error, MCPError) and error.code == CONNECTION_CLOSED:
        reason = "it exited before it answered initialize"
    else:
        reason = f"{type(error).__name__}: {error}"
    if server.pump is not None:
        server.pump.join(1.0)  # the server has been stopped: its stderr ends
    said = "".join(server.stderr).strip()[-2000:]
    return reason + (f"; its stderr ended with:\n{said}" if said else "")
