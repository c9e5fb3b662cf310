"""The layers of docs/architecture.md hold: every import in posttrain/ (inside functions too) points
to its own layer or one below, and no two packages import each other, directly or round a circle."""

import ast
from graphlib import TopologicalSorter
from pathlib import Path

import posttrain

# docs/architecture.md's table, top (highest number) to bottom; packages in one layer may import each other
LAYERS = {
    "cli": 9, "recipes": 8, "demo": 8, "trainer": 8, "rollout": 7, "workers": 6, "agents": 5, "tools": 5, "rewards": 5, "data": 5,
    "engines": 4, "models": 4, "controller": 3, "algos": 2, "protocol": 2, "keys": 2, "config": 2, "errors": 1, "timing": 1,
}
ROOT = Path(posttrain.__file__).parent


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


def test_every_package_is_placed_in_a_layer():
    packages = {package_of(module) for module in imports()} - {"posttrain"}
    assert packages <= LAYERS.keys(), f"place {sorted(packages - LAYERS.keys())} in docs/architecture.md's table and here"


def test_imports_point_down_only():
    upward = sorted(
        f"{module} imports {name}"
        for module, names in imports().items() if module != "posttrain"
        for name in names if LAYERS[package_of(name)] > LAYERS[package_of(module)]
    )
    assert upward == []


def test_no_two_packages_import_each_other():
    graph: dict[str, set[str]] = {}
    for module, names in imports().items():
        graph.setdefault(package_of(module), set()).update(package_of(name) for name in names if package_of(name) != package_of(module))
    TopologicalSorter(graph).prepare()  # a CycleError names the circle
