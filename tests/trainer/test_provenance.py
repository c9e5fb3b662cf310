"""What made a run: provenance.json's contents, posttrain --version, and the places that show or compare it."""

import json
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from posttrain.cli.compare import compare_evaluations
from posttrain.models.loading import cpu_computes_bf16
from posttrain.recipes.table import made_by
from posttrain.trainer import provenance
from posttrain.trainer.report import write_report
from tests.optional import require
from tests.trainer.test_intervals import write_episodes

REPO = Path(__file__).resolve().parents[2]


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_provenance_names_the_libraries_the_device_and_the_command():
    found = provenance.collect(["posttrain", "train", "data.seed=3"])
    assert found["libraries"]["torch"] == metadata.version("torch")
    assert set(provenance.CORE) <= set(found["libraries"])
    assert found["device"]["native_bf16"] == cpu_computes_bf16() and found["device"]["torch_threads"] >= 1
    assert found["command"] == ["posttrain", "train", "data.seed=3"]
    assert found["posttrain"]["version"] == metadata.version("posttrain")


def test_the_outside_libraries_installed_are_named_with_their_versions():
    require("reasoning_gym", 'reasoning-gym is installed by scripts/setup.sh (pip install -e ".[envs]")')
    found = provenance.collect()["libraries"]
    assert found["reasoning_gym"] == metadata.version("reasoning-gym")
    assert "gem" not in found or found["gem"] == metadata.version("gem-llm")  # named only where installed


def test_the_commit_and_uncommitted_changes_of_a_work_tree(tmp_path):
    assert provenance.git_state(tmp_path) is None  # not a work tree: an installed package
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    assert provenance.git_state(tmp_path) == {"commit": git(tmp_path, "rev-parse", "HEAD"), "dirty": False}
    (tmp_path / "new.txt").write_text("untracked\n")
    assert provenance.git_state(tmp_path)["dirty"] is False  # an untracked file changes nothing that ran
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.git_state(tmp_path)["dirty"] is True


def test_posttrain_version_prints_the_version_and_the_checkout_s_commit(capsys):
    from posttrain.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"posttrain {metadata.version('posttrain')} (commit {git(REPO, 'rev-parse', 'HEAD')[:12]}")


def runs_with(tmp_path: Path, torch_versions: tuple[str, str]) -> tuple[Path, Path]:
    """Two run directories with the same episodes, made by torch of the given versions."""
    files = []
    for name, version in zip("ab", torch_versions):
        run = tmp_path / name
        run.mkdir(parents=True)
        made = provenance.collect([name])
        made["libraries"]["torch"] = version
        (run / provenance.PROVENANCE).write_text(json.dumps(made))
        (run / "validation").mkdir()
        files.append(write_episodes(run / "validation" / "step_2.jsonl", [True, False] * 5, [1] * 10))
    return files[0], files[1]


def test_compare_warns_when_the_two_runs_were_made_differently(tmp_path, capsys):
    compare_evaluations(*runs_with(tmp_path / "same", ("2.13.0", "2.13.0")))
    assert "made differently" not in capsys.readouterr().out  # the commands differ, which is not a difference
    compare_evaluations(*runs_with(tmp_path / "other", ("2.13.0", "2.12.1")))
    assert "A and B were made differently" in (out := capsys.readouterr().out) and "libraries.torch: 2.13.0 vs 2.12.1" in out


def test_the_report_and_a_recipe_s_table_say_what_made_them(tmp_path):
    a, b = runs_with(tmp_path, ("2.13.0", "2.12.1"))
    report = write_report(a.parents[1]).read_text()
    assert f"Made by: {provenance.summary(provenance.find(a))}" in report and "torch 2.13.0" in report
    assert made_by({"one": a.parents[1], "two": a.parents[1]}) == ["", f"Made by: {provenance.summary(provenance.find(a))}"]
    differing = made_by({"one": a.parents[1], "two": b.parents[1]})
    assert differing[1] == "Made by (the stages differ):" and "torch 2.12.1" in differing[3]


@pytest.mark.parametrize("where", ["run", "validation"])
def test_a_file_finds_the_provenance_of_the_run_it_lies_in(tmp_path, where):
    (tmp_path / provenance.PROVENANCE).write_text('{"posttrain": {"version": "9"}}')
    folder = tmp_path if where == "run" else tmp_path / "validation"
    folder.mkdir(exist_ok=True)
    assert provenance.find(folder / "episodes.jsonl") == {"posttrain": {"version": "9"}}
    assert provenance.find(tmp_path.parent / "elsewhere.jsonl") is None
