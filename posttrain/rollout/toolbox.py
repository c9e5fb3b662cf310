"""The tools a tool-calling agent uses during a run (an environment that takes the ``toolbox``
resource, e.g. ``env.name: tools``): loaded, started, stopped.

``tool_schemas`` is what every prompt is told (read before the data is tokenised); ``open_toolbox``
makes the process's :class:`~posttrain.tools.ToolBox`: the ``env.tools`` functions, the
``env.mcp_servers`` started for the run, and the run's tool format (``env.tool_format``, with the call
parser ``env.tool_parser`` names where the format uses one). ``close`` on the box stops the servers and the call process.
When ``env.tools`` lists the built-in ``search`` tool, the rollout opens the retriever first and
hands its address to the tool through ``$POSTTRAIN_RETRIEVER_URL``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.agents.env import EpisodeSample
from posttrain.config.schema import EnvConfig
from posttrain.models.tool_formats import make_tool_format
from posttrain.rollout.environments import load_env_class, wanted_resources
from posttrain.tools import Tool, ToolBox, load_tools
from posttrain.tools.env import ToolEnv
from posttrain.tools.load import check_unique, has_reward, row_tool_class

SEARCH_TOOL = "posttrain.tools:search"


def uses_tools(env: EnvConfig) -> bool:
    """The environment's class takes the run's tools: its constructor asks for the ``toolbox`` resource
    (``ToolEnv``, ``env.name: tools``; rollout/environments.py)."""
    return env.name is not None and "toolbox" in wanted_resources(load_env_class(env.name, env.path, env.class_name), env.options)


def needs_retriever(env: EnvConfig) -> bool:
    return uses_tools(env) and SEARCH_TOOL in [spec for spec in env.tools if isinstance(spec, str)]


def _load(env: EnvConfig) -> tuple[list[Tool], Any]:
    tools = load_tools(env.tools, env.tool_output_chars)
    servers = None
    if env.mcp_servers:
        from posttrain.tools.mcp import McpServers

        servers = McpServers(env.mcp_servers, max_chars=env.tool_output_chars)
        tools += servers.tools()
        check_unique(tools)
    return tools, servers  # none at all is for rows that bring their own (ToolEnv.reset refuses a row with none)


def tool_schemas(env: EnvConfig) -> list[dict[str, Any]]:
    """The schemas of the run's tools, as the model receives them (MCP servers are started to ask them)."""
    if not uses_tools(env):
        return []
    tools, servers = _load(env)
    if servers is not None:
        servers.close()
    return [tool.schema for tool in tools]


def open_toolbox(env: EnvConfig, tokenizer: Any) -> ToolBox:
    tools, servers = _load(env)
    try:
        tool_format = make_tool_format(env.tool_format, tokenizer, [tool.schema for tool in tools], env.tool_parser)
        tool_format.parse("")  # its parser is made now: a parser that cannot be had fails before any worker starts
        row_class = row_tool_class(env.tools, env.tool_output_chars)
    except BaseException:  # the MCP servers are running: none is left behind, whatever failed
        if servers is not None:
            servers.close()
        raise
    return ToolBox(
        tools, tool_format=tool_format, timeout_s=env.tool_timeout_s,
        max_calls=env.max_tool_calls, mcp=servers, row_class=row_class,
    )


def sample_checker(env: EnvConfig, by_data_source: bool = True) -> Callable[[EpisodeSample], None]:
    """ToolEnv's ``check_sample`` with the run's tools, for the rollout to run on every row before any
    worker starts; ``by_data_source``: answers are scored by their data source's function (no custom
    one). It loads ``env.tools``; listing any MCP server counts as having tools (none is started here)."""
    tools = load_tools(env.tools, env.tool_output_chars)
    classes = [tool.tool_class for tool in tools if tool.tool_class is not None] + [row_tool_class(env.tools)]
    scores = any(has_reward(tool_class.load()) for tool_class in classes if tool_class is not None)
    facts = {"run_has_tools": bool(tools or env.mcp_servers), "scores_episodes": scores, "by_data_source": by_data_source}

    def check(sample: EpisodeSample) -> None:
        ToolEnv.check_sample(sample, env.options, **facts)
    return check
