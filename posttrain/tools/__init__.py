"""Tools a model calls in its own tool-call format: plain Python functions and classes, schema files, MCP servers.

    schema.py    a function's JSON schema from its signature and docstring
    load.py      ``env.tools`` entries → :class:`Tool` (schema + a picklable reference to run it)
    execute.py   :class:`ToolBox`: argument checks, calls in a child process with deadlines, errors as text
    instances.py tool classes' instances: one per episode, each episode's in a process forked for it
    mcp.py       tools discovered on MCP servers (stdio), called through the same box
    builtin.py   ``calculator``, ``python``, ``search``
    sandbox.py   how ``python`` runs a program: under bubblewrap where it works, else with limits only

The environment that lets a model use them is ``posttrain.tools.env.ToolEnv`` (``env.name: tools``).
"""

from posttrain.tools.builtin import calculator, python, search
from posttrain.tools.execute import ERROR_KINDS, CallResult, ToolBox
from posttrain.tools.load import Tool, ToolFunction, load_tools
from posttrain.models.tool_formats import ParsedCall, ParsedTurn
from posttrain.tools.schema import ToolSpecError, function_schema

__all__ = [
    "ERROR_KINDS", "CallResult", "ParsedCall", "ParsedTurn", "Tool", "ToolBox", "ToolFunction", "ToolSpecError", "calculator", "function_schema", "load_tools", "python", "search",
]
