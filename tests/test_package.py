"""posttrain as a user installs it: the wheel built from this checkout, installed where Python imports it
in place of the editable copy, run from a directory outside the checkout, with no network."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import preset_names

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TOOL = '''def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(a directory outside the checkout, the environment that imports posttrain from the installed wheel)."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"  # the checkout's files as they are now, so the build leaves the checkout untouched
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.splitlines()  # tracked, and new files not ignored
    for name in listed:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "wheel")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (root / "wheel").glob("posttrain-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(root / "site"), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = os.environ | {"PYTHONPATH": str(root / "site"), "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    work = root / "elsewhere"
    work.mkdir()
    return work, env


def run(installed, *code_or_args: str, module: bool = True) -> subprocess.CompletedProcess:
    work, env = installed
    command = [sys.executable, "-m", "posttrain", *code_or_args] if module else [sys.executable, "-c", *code_or_args]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_the_installed_package_runs_its_recipes_presets_and_data_from_elsewhere(installed):
    work, _ = installed
    assert "textarena" in run(installed, "recipe", "list").stdout  # the recipes' YAML files are package data
    (work / "my_tools.py").write_text(TOOL)
    names = preset_names()
    # the other commands in one process (each `python -m posttrain` pays the imports again): as main() runs them
    checked = run(installed, "import posttrain\nprint('imported from', posttrain.__file__)\n"
                             "from posttrain.cli.main import main\n"
                             f"for name in {names!r}:\n"
                             "    assert main(['config', '--preset', name]) == 0, name\n"
                             "assert main(['prepare', 'gsm8k', '--out', 'gsm8k']) == 0\n"  # the vendored GSM8K copy is package data
                             "assert main(['prepare', 'arithmetic', '--out', 'arithmetic', 'train_size=8', 'val_size=2']) == 0\n"
                             "assert main(['tools', 'my_tools.py:add']) == 0\n"
                             "assert main(['setup', '--dry-run', '--machine', 'cpu']) == 0\n", module=False)
    found = Path(checked.stdout.split("imported from ", 1)[1].split("\n", 1)[0])
    assert found.is_relative_to(work.parent / "site") and not found.is_relative_to(REPO)  # the wheel's copy, not the checkout's
    assert checked.stdout.count("trainer:") >= len(names)  # each preset's whole config printed
    assert (work / "gsm8k" / "train.parquet").is_file() and (work / "arithmetic" / "test.parquet").is_file()
    assert '"name": "add"' in checked.stdout
    assert "--no-deps bfcl-eval==" in checked.stdout  # `posttrain setup`'s plan, from the installed package
