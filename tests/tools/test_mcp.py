"""MCP servers over stdio (posttrain/tools/mcp.py): discovery, calls through the ToolBox, failures as results."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from posttrain.tools import ParsedCall, ToolBox, ToolSpecError
from posttrain.tools.mcp import McpServers

SERVER = textwrap.dedent('''
    import os
    import sys

    import anyio
    from mcp.server.mcpserver import Image, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("test-tools")
    PREFIX = os.environ.get("TOOL_PREFIX", "")  # env.mcp_servers[i].env reaches the server

    @server.tool(name=PREFIX + "add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(name=PREFIX + "fail")
    def fail() -> str:
        raise ValueError("this tool always fails")

    @server.tool(name=PREFIX + "refuse")
    def refuse() -> str:
        """Refuse, with a reason."""
        raise ToolError("no such city")

    @server.tool(name=PREFIX + "picture")
    def picture() -> list:
        """A caption and an image."""
        return ["a red dot", Image(data=b"\\x89PNG", format="png")]

    @server.tool(name=PREFIX + "slow")
    async def slow(seconds: float) -> str:
        """Sleep for a while."""
        await anyio.sleep(seconds)
        return "awake"

    @server.tool(name=PREFIX + "die")
    def die() -> str:
        """Kill the server."""
        os._exit(1)

    if __name__ == "__main__":
        print("test server starting", file=sys.stderr, flush=True)
        server.run("stdio")
''')


@pytest.fixture(scope="module")
def server_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture(scope="module")
def servers(server_file: Path) -> Iterator[McpServers]:
    servers = McpServers([{"command": [sys.executable, str(server_file)]}])
    yield servers
    servers.close()


def server_processes(server_file: Path) -> list[psutil.Process]:
    """The running children of this process that run ``server_file``."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if str(server_file) in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def call(box: ToolBox, name: str, arguments: str) -> tuple[str | None, str]:
    (result,) = box.run([ParsedCall(name, arguments)])
    return result.error, result.text


def test_tools_are_discovered_with_their_schemas(servers: McpServers) -> None:
    tools = {tool.name: tool for tool in servers.tools()}
    assert set(tools) == {"add", "fail", "refuse", "picture", "slow", "die"}
    assert all(tool.mcp_server == 0 and tool.function is None for tool in tools.values())
    add = tools["add"].schema["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["type"] == "object"
    assert set(add["parameters"]["properties"]) == {"a", "b"}
    assert add["parameters"]["properties"]["a"]["type"] == "integer"
    assert sorted(add["parameters"]["required"]) == ["a", "b"]
    assert tools["slow"].parameters["properties"]["seconds"]["type"] == "number"
    assert tools["fail"].schema["function"]["description"] == "fail"  # no docstring: its name


def test_calls_through_the_toolbox(servers: McpServers) -> None:
    box = ToolBox(servers.tools(), mcp=servers, timeout_s=15.0)  # the server logs a crash's traceback slowly (rich)
    assert call(box, "add", '{"a": 2, "b": 3}') == (None, "5")
    # refused by the box's schema check; the server would have coerced "2" to 2 and answered
    error, text = call(box, "add", '{"a": "2", "b": 3}')
    assert error == "bad_arguments" and "'2' is not of type 'integer'" in text
    assert call(box, "add", '{"a": 2}')[0] == "bad_arguments"
    # an unexpected exception's text stays on the server (mcp 2); a ToolError's reaches the model
    assert call(box, "fail", "{}") == ("exception", "Error (exception): Error executing tool fail")
    assert call(box, "picture", "{}") == (None, "a red dot\n[image]")  # other content is named
    assert call(box, "refuse", "{}") == ("exception", "Error (exception): Error executing tool refuse: no such city")


def test_timeout_then_the_server_still_answers(servers: McpServers) -> None:
    box = ToolBox(servers.tools(), mcp=servers, timeout_s=1.0)
    started = time.monotonic()
    error, text = call(box, "slow", '{"seconds": 30}')
    assert error == "timeout" and "1 s" in text
    assert time.monotonic() - started < 5
    # the session goes on (generous deadlines: the machine may be loaded)
    assert servers.call(0, "slow", {"seconds": 0.01}, timeout_s=10).text == "awake"
    assert servers.call(0, "add", {"a": -1, "b": 1}, timeout_s=10).text == "0"


def test_results_are_cut_to_max_chars(server_file: Path) -> None:
    servers = McpServers([{"command": [sys.executable, str(server_file)]}], max_chars=3)
    try:
        result = servers.call(0, "add", {"a": 5000, "b": 5000}, timeout_s=5)
        assert result.ok and result.text == "100 ...(cut at 3 characters)"
    finally:
        servers.close()


def test_a_dying_server_is_a_crash_and_close_stops_every_process(server_file: Path) -> None:
    before = {process.pid for process in server_processes(server_file)}
    command = [sys.executable, str(server_file)]
    servers = McpServers([{"command": command}, {"command": command, "env": {"TOOL_PREFIX": "other_"}}])
    pids = {process.pid for process in server_processes(server_file)} - before
    assert len(pids) == 2
    assert {tool.name: tool.mcp_server for tool in servers.tools()}["other_add"] == 1
    assert len(servers.tools()) == 12
    result = servers.call(0, "die", {}, timeout_s=5)
    assert result.error == "crashed" and result.name == "die" and result.text.startswith("Error (crashed):")
    assert servers.call(0, "add", {"a": 1, "b": 1}, timeout_s=5).error == "crashed"  # not restarted
    assert servers.call(1, "other_add", {"a": 1, "b": 1}, timeout_s=5).text == "2"  # the other server goes on
    servers.close()
    servers.close()  # again: nothing
    assert not alive(pids)
    assert servers.call(1, "other_add", {"a": 1, "b": 1}, timeout_s=5).error == "crashed"


def test_same_tool_on_two_servers_is_refused_and_both_are_stopped(server_file: Path) -> None:
    before = {process.pid for process in server_processes(server_file)}
    command = [sys.executable, str(server_file)]
    with pytest.raises(ToolSpecError, match=r"\['add', 'die', 'fail', 'picture', 'refuse', 'slow'\] are given more than once"):
        McpServers([{"command": command}, {"command": command}])
    assert not {process.pid for process in server_processes(server_file)} - before


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.add(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def test_a_missing_program_is_named() -> None:
    with pytest.raises(ToolSpecError, match=r"/nonexistent/program.*cannot run it") as raised:
        McpServers([{"command": ["/nonexistent/program", "--flag"]}])
    assert "env.mcp_servers[0]" in str(raised.value)


def test_a_server_that_exits_on_start_is_explained(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('missing API key', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(ToolSpecError, match=r"(?s)broken\.py.*exited before it answered initialize.*missing API key"):
        McpServers([{"command": [sys.executable, str(script)]}])


def test_a_silent_server_times_out_on_start(tmp_path: Path) -> None:
    script = tmp_path / "silent.py"
    script.write_text("import time\ntime.sleep(60)\n")
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(ToolSpecError, match=r"silent\.py.*no answer to initialize within 0\.5 s"):
        McpServers([{"command": [sys.executable, str(script)]}], start_timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert not alive({child.pid for child in psutil.Process().children(recursive=True)} - before)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("python server.py", r"env\.mcp_servers\[0\] = 'python server\.py': give \{command"),
        ({"command": "python server.py"}, r"env\.mcp_servers\[0\]\.command = 'python server\.py': give a non-empty list"),
        ({"command": []}, r"env\.mcp_servers\[0\]\.command = \[\]"),
        ({"command": ["python", 3]}, r"env\.mcp_servers\[0\]\.command"),
        ({"command": ["python"], "env": ["A=1"]}, r"env\.mcp_servers\[0\]\.env"),
        ({"command": ["python"], "cmd": ["x"]}, r"env\.mcp_servers\[0\] = "),
    ],
)
def test_bad_entries_are_refused(spec: object, message: str) -> None:
    with pytest.raises(ToolSpecError, match=message):
        McpServers([spec])


def test_a_runs_toolbox_starts_its_mcp_servers_beside_its_functions_and_stops_them(tmp_path, tokenizer):
    """What a run opens for env.mcp_servers (rollout/toolbox.py): the server's tools join the Python
    ones in the prompt's schemas and in one box; closing the box stops the server."""
    from posttrain.config.schema import EnvConfig
    from posttrain.rollout.toolbox import open_toolbox, tool_schemas

    server_file = tmp_path / "server.py"  # a file of its own: the module's servers run the other one
    server_file.write_text(SERVER)
    env = EnvConfig(name="tools", tools=["posttrain.tools:calculator"],
                    mcp_servers=[{"command": [sys.executable, str(server_file)], "env": {"TOOL_PREFIX": "srv_"}}])
    assert {s["function"]["name"] for s in tool_schemas(env)} >= {"calculator", "srv_add", "srv_slow"}
    assert server_processes(server_file) == []  # asking for the schemas started the server and stopped it
    box = open_toolbox(env, tokenizer)
    try:
        add, calc = box.run([ParsedCall("srv_add", '{"a": 40, "b": 2}'), ParsedCall("calculator", '{"expression": "6*7"}')])
        assert (add.text, calc.text) == ("42", "42")
        assert server_processes(server_file) != []
    finally:
        box.close()
    assert server_processes(server_file) == []
