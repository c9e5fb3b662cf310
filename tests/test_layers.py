"""The layers of docs/architecture.md hold: every import in posttrain/ (inside functions too) points
to its own layer or one below, and no two packages import each other, directly or round a circle.
The layers are read from the doc's table, the one place they are written."""

import ast
import re
from graphlib import TopologicalSorter
from pathlib import Path

import posttrain

ROOT = Path(posttrain.__file__).parent
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"


def layers_of_the_doc(text: str) -> dict[str, int]:
    """The "## Layers" table's rows, ``| 3 | `rollout/`, `keys.py` | ... |``, as {package: row number}
    (1 is the top); packages in one row may import each other."""
    table = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found = {}
    for number, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", table, flags=re.MULTILINE):
        for name in re.findall(r"`([a-z_]+)(?:/|\.py)`", names):
            found[name] = int(number)
    return found


LAYERS = layers_of_the_doc(ARCHITECTURE.read_text(encoding="utf-8"))


def package_of(module: str) -> str:
    """``posttrain.trainer.sync`` → ``trainer``; ``posttrain`` → ``posttrain`` (the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports() -> dict[str, set[str]]:
    """Each posttrain module (dotted name) → the posttrain modules it imports."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[module] = {name for name in names if name.startswith("posttrain.")}
    return found


def test_the_docs_table_is_read_as_written():
    assert LAYERS["cli"] == 1 and LAYERS["trainer"] == LAYERS["recipes"] == 2 and LAYERS["rollout"] == 3
    assert LAYERS["errors"] == LAYERS["metrics"] == max(LAYERS.values())
    assert layers_of_the_doc("## Layers\n| # | layer |\n|---|---|\n| 1 | `a/`, `b.py` | x |\n| 2 | `c/` | y |\n## Next\n| 3 | `d/` | z |") == \
        {"a": 1, "b": 1, "c": 2}


def test_every_package_is_placed_in_a_layer():
    packages = {package_of(module) for module in imports()} - {"posttrain"}
    assert packages <= LAYERS.keys(), f"place {sorted(packages - LAYERS.keys())} in docs/architecture.md's table and here"


def test_imports_point_down_only():
    upward = sorted(
        f"{module} imports {name}"
        for module, names in imports().items() if module != "posttrain"
        for name in names if LAYERS[package_of(name)] < LAYERS[package_of(module)]
    )
    assert upward == []


def test_no_two_packages_import_each_other():
    graph: dict[str, set[str]] = {}
    for module, names in imports().items():
        graph.setdefault(package_of(module), set()).update(package_of(name) for name in names if package_of(name) != package_of(module))
    TopologicalSorter(graph).prepare()  # a CycleError names the circle
