"""The layers of docs/architecture.md hold: every import in posttrain/ points to its own layer or one
below, no two packages import each other, directly or round a circle, and no package imports one that the
doc says it never imports (``"`workers/` never imports `agents/`"``, ``"`tools/` may import `agents/`,
never the reverse"``), in its own row too. The layers and those rules are read from the doc, the one place
they are written.

Every way one module can reach another counts as an import: ``import posttrain.x``, ``from posttrain.x
import y``, ``from posttrain import x`` (the module ``posttrain.x``), relative imports (``from . import y``,
``from ..x import y``), inside functions too, and a string that names a posttrain module (the
``importlib.import_module`` targets of a registry, ``"posttrain.x.y"`` or ``"posttrain.x.y:function"``) — but
not ``-m posttrain.cli`` in a command line, which starts a process."""

import ast
import re
from graphlib import TopologicalSorter
from pathlib import Path

import pytest

import posttrain

ROOT = Path(posttrain.__file__).parent
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"
MODULE_STRING = re.compile(r"(posttrain(?:\.[a-z_0-9]+)+)(?::\w+)?")


def layers_section(text: str) -> str:
    """The "## Layers" section: its table and the rules written under it."""
    return text.split("## Layers", 1)[1].split("\n## ", 1)[0]


def layers_of_the_doc(text: str) -> dict[str, int]:
    """The "## Layers" table's rows, ``| 3 | `rollout/`, `keys.py` | ... |``, as {package: row number}
    (1 is the top)."""
    found = {}
    for number, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", layers_section(text), flags=re.MULTILINE):
        for name in re.findall(r"`([a-z_]+)(?:/|\.py)`", names):
            found[name] = int(number)
    return found


def forbidden_of_the_doc(text: str) -> set[tuple[str, str]]:
    """The (importer, imported) pairs the Layers section forbids in so many words: "`a/` never imports `b/`"
    (or "`b/` and `c/`"), and "`a/` may import `b/`, never the reverse" (which forbids b → a)."""
    section = layers_section(text)
    package = r"`([a-z_]+)(?:/|\.py)`"
    any_package = r"`[a-z_]+(?:/|\.py)`"
    pairs = set()
    for importer, targets in re.findall(rf"{package} never imports ((?:{any_package}(?:,| or| and)? ?)+)", section):
        pairs.update((importer, target) for target in re.findall(package, targets))
    for importer, imported in re.findall(rf"{package} may import {package}, never the reverse", section):
        pairs.add((imported, importer))
    return pairs


TEXT = ARCHITECTURE.read_text(encoding="utf-8")
LAYERS = layers_of_the_doc(TEXT)
FORBIDDEN = forbidden_of_the_doc(TEXT)


def package_of(module: str) -> str:
    """``posttrain.trainer.sync`` → ``trainer``; ``posttrain`` → ``posttrain`` (the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_names(root: Path) -> dict[str, Path]:
    """Each module under ``root`` (the ``posttrain`` package directory) by its dotted name."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(module: str, source: str, modules: set[str], is_package: bool = False) -> set[str]:
    """The posttrain modules that ``module`` (whose code is ``source``) reaches, in any of the forms above."""
    tree = ast.parse(source)
    started = {id(node.elts[i + 1]) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple))
               for i, element in enumerate(node.elts[:-1]) if isinstance(element, ast.Constant) and element.value == "-m"}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, one level up per extra dot
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:  # `from a import b` reaches the module a.b where there is one, else a
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in started:
            match = MODULE_STRING.fullmatch(node.value)
            if match and match.group(1) in modules:
                names.add(match.group(1))
    return {name for name in names if name == "posttrain" or name.startswith("posttrain.")}


def imports() -> dict[str, set[str]]:
    """Each posttrain module (dotted name) → the posttrain modules it imports."""
    modules = module_names(ROOT)
    return {module: imports_of(module, path.read_text(), set(modules), path.name == "__init__.py") - {module}
            for module, path in modules.items()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports that point up a layer (``posttrain`` itself, a docstring and a version, is in none)."""
    return sorted(f"{module} imports {name}" for module, names in graph.items() if module != "posttrain"
                  for name in names if name != "posttrain" and LAYERS[package_of(name)] < LAYERS[package_of(module)])


def forbidden(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} imports {name}" for module, names in graph.items()
                  for name in names if (package_of(module), package_of(name)) in FORBIDDEN)


def check_no_circle(graph: dict[str, set[str]]) -> None:
    packages: dict[str, set[str]] = {}
    for module, names in graph.items():
        packages.setdefault(package_of(module), set()).update(package_of(name) for name in names if package_of(name) != package_of(module))
    TopologicalSorter(packages).prepare()  # a CycleError names the circle


GRAPH = imports()


def test_the_docs_table_and_rules_are_read_as_written():
    assert LAYERS["cli"] == 1 and LAYERS["trainer"] == LAYERS["recipes"] == 2 and LAYERS["rollout"] == 3
    assert LAYERS["errors"] == LAYERS["metrics"] == max(LAYERS.values())
    assert layers_of_the_doc("## Layers\n| # | layer |\n|---|---|\n| 1 | `a/`, `b.py` | x |\n| 2 | `c/` | y |\n## Next\n| 3 | `d/` | z |") == \
        {"a": 1, "b": 1, "c": 2}
    assert forbidden_of_the_doc("## Layers\n`a/` never imports `b/` or `c.py`; `d/` may import `e/`, never the reverse.\n## Next\n"
                                "`f/` never imports `g/`.") == {("a", "b"), ("a", "c"), ("e", "d")}
    assert ("agents", "tools") in FORBIDDEN and ("workers", "agents") in FORBIDDEN


@pytest.mark.parametrize("code, module, expected", [
    ("from posttrain import keys, errors", "posttrain.trainer.sync", {"posttrain.keys", "posttrain.errors"}),
    ("import posttrain.trainer.run as run", "posttrain.cli.main", {"posttrain.trainer.run"}),
    ("from . import env", "posttrain.tools.box", {"posttrain.tools.env"}),
    ("from .env import ToolEnv", "posttrain.tools.box", {"posttrain.tools.env"}),
    ("from ..agents import loop", "posttrain.tools.box", {"posttrain.agents.loop"}),
    ("from .. import keys", "posttrain.tools", {"posttrain.keys"}),  # from a package's __init__
    ("def f():\n    from posttrain.trainer import run", "posttrain.rollout.agent", {"posttrain.trainer.run"}),
    ("importlib.import_module('posttrain.tools.env')", "posttrain.agents.x", {"posttrain.tools.env"}),
    ("TABLE = {'a': 'posttrain.tools.env:ToolEnv'}", "posttrain.agents.x", {"posttrain.tools.env"}),
    ("cmd = [python, '-m', 'posttrain.cli', 'serve']", "posttrain.agents.x", set()),  # a process, not an import
    ("log = logging.getLogger('posttrain.retriever')", "posttrain.agents.x", set()),  # no such module
])
def test_each_form_of_import_is_seen(code, module, expected):
    modules = {"posttrain.keys", "posttrain.errors", "posttrain.trainer.run", "posttrain.tools.env", "posttrain.tools.box",
               "posttrain.agents.loop", "posttrain.agents", "posttrain.tools", "posttrain.cli"}
    assert imports_of(module, code, modules, is_package=module == "posttrain.tools") == expected


@pytest.mark.parametrize("module, code, check", [
    ("posttrain.rollout.agent", "from posttrain import trainer", "upward"),  # `from posttrain import X`
    ("posttrain.rollout.agent", "from ..trainer import run", "upward"),  # relative
    ("posttrain.rollout.agent", "import importlib\nimportlib.import_module('posttrain.cli.main')", "upward"),  # by string
    ("posttrain.agents.loop", "from posttrain.tools import env", "forbidden"),  # same row, forbidden by the doc
    ("posttrain.agents.loop", "from ..tools import env", "forbidden"),
])
def test_a_forbidden_import_of_each_kind_is_caught(module, code, check):
    graph = {name: set(found) for name, found in GRAPH.items()}
    graph[module] |= imports_of(module, code, set(GRAPH))
    assert {"upward": upward, "forbidden": forbidden}[check](graph) != []


def test_every_package_is_placed_in_a_layer():
    packages = {package_of(module) for module in GRAPH} - {"posttrain"}
    assert packages <= LAYERS.keys(), f"place {sorted(packages - LAYERS.keys())} in docs/architecture.md's table and here"


def test_imports_point_down_only():
    assert upward(GRAPH) == []


def test_no_import_the_doc_forbids():
    assert forbidden(GRAPH) == []


def test_no_two_packages_import_each_other():
    check_no_circle(GRAPH)
