"""Loading tools from env.tools entries: schemas from signatures and docstrings, and the refusals."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from posttrain.tools import Tool, ToolFunction, ToolSpecError, load_tools

# a user's tool file: plain Python, nothing from posttrain
MY_TOOLS = '''
from typing import Literal


def lookup(query: str, limit: int, score: float, exact: bool, tags: list[str], mode: Literal["a", "b"],
           page: int | None = None, lang: str = "en") -> str:
    """Look a word up in the dictionary.

    Args:
        query: The word to find.
        limit: How many entries to return.
        score: The lowest score shown.
        exact: Whether to match the whole word.
        tags: Tags the entries must have.
        mode: Which dictionary to search.
        page: The page of results.
        lang: The language code.
    """
    return f"{query}:{limit}:{mode}:{page}:{lang}"


async def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: The page's address.
    """
    return url.upper()
'''


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def tool_file(tmp_path) -> str:
    return write(tmp_path / "my_tools.py", MY_TOOLS)


def test_function_schema_has_json_types_enum_required_and_descriptions(tool_file):
    """Each hint becomes its JSON type; only parameters without a default are required."""
    (tool,) = load_tools([f"{tool_file}:lookup"])
    function = tool.schema["function"]
    assert tool.schema["type"] == "function" and tool.name == "lookup"
    assert function["description"] == "Look a word up in the dictionary."
    properties = function["parameters"]["properties"]
    assert function["parameters"]["type"] == "object"
    assert list(properties) == ["query", "limit", "score", "exact", "tags", "mode", "page", "lang"]
    assert properties["query"]["type"] == "string"
    assert properties["limit"]["type"] == "integer"
    assert properties["score"]["type"] == "number"
    assert properties["exact"]["type"] == "boolean"
    assert properties["tags"]["type"] == "array" and properties["tags"]["items"] == {"type": "string"}
    assert properties["mode"]["type"] == "string" and properties["mode"]["enum"] == ["a", "b"]
    assert properties["page"]["type"] == ["integer", "null"]
    assert properties["lang"]["type"] == "string"
    assert function["parameters"]["required"] == ["query", "limit", "score", "exact", "tags", "mode"]
    assert properties["query"]["description"] == "The word to find."
    assert properties["mode"]["description"] == "Which dictionary to search."
    assert properties["lang"]["description"] == "The language code."


def test_a_loaded_tool_refers_to_its_function_and_calls_it(tool_file, tmp_path, monkeypatch):
    """The tool holds an absolute, picklable reference; calling it runs the function and gives text."""
    monkeypatch.chdir(tmp_path)
    (tool,) = load_tools(["my_tools.py:lookup"])  # relative to the working directory
    assert isinstance(tool, Tool) and isinstance(tool.function, ToolFunction)
    assert Path(tool.function.source).is_absolute() and tool.function.name == "lookup"
    text = tool.function(query="cat", limit=2, score=0.5, exact=True, tags=[], mode="b")
    assert text == "cat:2:b:None:en"


def test_async_function_tool(tool_file):
    """An async function is described like any other, and calling it awaits it."""
    (tool,) = load_tools([f"{tool_file}:fetch"])
    assert tool.parameters["required"] == ["url"]
    assert tool.parameters["properties"]["url"] == {"type": "string", "description": "The page's address."}
    assert tool.function(url="x.org") == "X.ORG"


def test_module_spec():
    """``posttrain.tools:calculator`` loads the built-in calculator from its module."""
    (tool,) = load_tools(["posttrain.tools:calculator"])
    assert tool.name == "calculator" and tool.function.source == "posttrain.tools"
    assert tool.parameters["required"] == ["expression"]
    assert tool.function(expression="6*7") == "42"


def test_schema_file_with_implementation_module(tmp_path):
    """A schema file (one schema or a list) paired with a .py file of same-named functions."""
    schemas = [
        {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
        {"type": "function", "function": {"name": "ping", "description": "Say pong."}},
    ]
    (tmp_path / "tools.json").write_text(json.dumps(schemas))
    impl = write(tmp_path / "impl.py", """
        def add(a, b):
            return a + b

        def ping():
            return "pong"
    """)
    tools = load_tools([{"schemas": str(tmp_path / "tools.json"), "module": impl}])
    assert [tool.name for tool in tools] == ["add", "ping"]
    assert tools[0].schema == schemas[0]
    assert tools[1].parameters["type"] == "object"  # a schema without parameters takes no arguments
    assert tools[0].function(a=2, b=3) == "5" and tools[1].function() == "pong"


def test_refuses_missing_file(tmp_path):
    with pytest.raises(ToolSpecError, match="no such file"):
        load_tools([f"{tmp_path}/absent.py:lookup"])


def test_refuses_missing_function_and_lists_the_file_functions(tool_file):
    with pytest.raises(ToolSpecError, match=r"no function 'nope'.*fetch.*lookup"):
        load_tools([f"{tool_file}:nope"])


def test_refuses_a_spec_without_function_name(tool_file):
    with pytest.raises(ToolSpecError, match="FILE.py:FUNCTION"):
        load_tools([tool_file])


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('def f(x) -> str:\n    """Do."""\n', r"parameter 'x' has no type hint"),
        ('def f(*args: int) -> str:\n    """Do."""\n', r"\*args"),
        ('def f(**kw: int) -> str:\n    """Do."""\n', r"\*\*kw"),
        ('class Thing:\n    pass\n\ndef f(x: Thing) -> str:\n    """Do."""\n', r"parameter 'x'.*Thing.*no JSON form"),
        ("def f(x: int) -> str:\n    return ''\n", r"tool 'f' has no docstring"),
        ('from typing import Literal\ndef f(x: Literal["a", 1]) -> str:\n    """Do."""\n', r"parameter 'x'.*one JSON type"),
        ('def f(x: int | str) -> str:\n    """Do."""\n', r"parameter 'x'.*union of several types"),
        ('def f(x: dict[int, str]) -> str:\n    """Do."""\n', r"parameter 'x'.*str keys"),
    ],
    ids=["no-hint", "args", "kwargs", "class", "no-docstring", "mixed-literal", "union", "int-keys"],
)
def test_refuses_functions_it_cannot_describe(tmp_path, source, problem):
    """Each refusal names the tool or parameter and what is wrong."""
    path = write(tmp_path / "bad.py", source)
    with pytest.raises(ToolSpecError, match=problem):
        load_tools([f"{path}:f"])


def test_refuses_a_tool_file_that_fails_to_run(tmp_path):
    path = write(tmp_path / "broken.py", "import not_a_module_anywhere\n")
    with pytest.raises(ToolSpecError, match="running tool file.*ModuleNotFoundError"):
        load_tools([f"{path}:f"])


def test_refuses_a_duplicated_tool_name(tool_file, tmp_path):
    """The same name twice, even from different files, is refused with the name."""
    other = write(tmp_path / "other.py", 'def lookup(q: str) -> str:\n    """Other."""\n    return q\n')
    with pytest.raises(ToolSpecError, match=r"\['lookup'\].*more than once"):
        load_tools([f"{tool_file}:lookup", f"{other}:lookup"])


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "cannot read it as JSON"),
        ('{"name": "add"}', "is not a tool schema"),
        ('[{"type": "function", "function": {"description": "no name"}}]', "is not a tool schema"),
        ('{"type": "function", "function": {"name": "add", "parameters": {"type": "array"}}}', "parameters must be a JSON schema of type object"),
    ],
    ids=["not-json", "no-function", "no-name", "array-parameters"],
)
def test_refuses_a_malformed_schema_file(tmp_path, content, problem):
    (tmp_path / "tools.json").write_text(content)
    impl = write(tmp_path / "impl.py", "def add(a, b):\n    return a + b\n")
    with pytest.raises(ToolSpecError, match=problem):
        load_tools([{"schemas": str(tmp_path / "tools.json"), "module": impl}])


def test_refuses_a_schema_without_implementation(tmp_path):
    """Every schema in the file needs a function of its name in the module."""
    (tmp_path / "tools.json").write_text('{"type": "function", "function": {"name": "mul"}}')
    impl = write(tmp_path / "impl.py", "def add(a, b):\n    return a + b\n")
    with pytest.raises(ToolSpecError, match=r"no function 'mul'"):
        load_tools([{"schemas": str(tmp_path / "tools.json"), "module": impl}])


def test_refuses_an_unknown_entry_shape():
    with pytest.raises(ToolSpecError, match="give FILE.py:FUNCTION"):
        load_tools([{"schemas": "x.json"}])


OTHER_DOCSTRINGS = '''
def numpy_style(city: str, limits: dict[str, int]) -> str:
    """Weather for a city.

    Parameters
    ----------
    city : str
        The city's name.
    limits : dict[str, int]
        The most readings of each kind.
    """
    return city


def rest_style(city: str, days: int = 3) -> str:
    """Forecast for a city.

    :param city: The city's name.
    :param days: How many days ahead.
    """
    return city
'''


def test_numpy_and_rest_docstrings_describe_the_parameters_and_a_dict_is_an_object_of_its_values(tmp_path):
    path = write(tmp_path / "weather.py", OTHER_DOCSTRINGS)
    numpy_tool, rest_tool = load_tools([f"{path}:numpy_style", f"{path}:rest_style"])
    numpy_function, rest_function = numpy_tool.schema["function"], rest_tool.schema["function"]
    assert numpy_function["description"] == "Weather for a city." and rest_function["description"] == "Forecast for a city."
    properties = numpy_function["parameters"]["properties"]
    assert properties["city"] == {"type": "string", "description": "The city's name."}
    assert properties["limits"] == {"type": "object", "additionalProperties": {"type": "integer"},
                                    "description": "The most readings of each kind."}
    assert rest_function["parameters"]["properties"]["days"] == {"type": "integer", "description": "How many days ahead."}
    assert rest_function["parameters"]["required"] == ["city"]
