"""The shape the code keeps (../shared/STYLE.md, issue 35): files and functions small enough to hold
one idea, and no branch on a mode's, a run's or an environment's name outside the one place that
picks the mode (trainer/modes.py): each mode and environment supplies its own parts instead."""

import ast
from pathlib import Path

import posttrain

ROOT = Path(posttrain.__file__).parent
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60
MODE_SWITCH = ROOT / "trainer" / "modes.py"


def sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ROOT.rglob("*.py"))}


def name_branches(tree: ast.Module) -> list[int]:
    """Lines comparing ``<x>.mode``, ``<x>.label`` or ``env.name`` with a string constant."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides):
            continue
        for side in sides:
            if isinstance(side, ast.Attribute) and (
                side.attr in ("mode", "label")
                or (side.attr == "name" and isinstance(side.value, (ast.Name, ast.Attribute))
                    and (side.value.id if isinstance(side.value, ast.Name) else side.value.attr) == "env")
            ):
                found.append(node.lineno)
    return found


def test_no_file_is_over_500_lines():
    long = [f"{path.relative_to(ROOT)}: {len(path.read_text().splitlines())}" for path in sources()
            if len(path.read_text().splitlines()) > MAX_FILE_LINES]
    assert long == []


def test_no_function_is_over_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
        for path, tree in sources().items() for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_no_mode_label_or_environment_name_branch_outside_the_mode_switch():
    branches = [f"{path.relative_to(ROOT)}:{line}" for path, tree in sources().items() if path != MODE_SWITCH for line in name_branches(tree)]
    assert branches == []


def test_the_branch_finder_finds_what_it_is_named_for():
    code = 'a = config.trainer.mode == "async"\nb = env.name == "doctor"\nc = config.env.name != "tools"\nd = parts.label == "sft"\n' \
           'e = loss_agg_mode == "token-mean"\nf = self.resume_mode == "auto"\n'
    assert name_branches(ast.parse(code)) == [1, 2, 3, 4]
