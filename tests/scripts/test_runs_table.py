"""scripts/runs_table.py: the compared rows of several recipe reports side by side, each difference under its
own column (a report without a column leaves it blank), and the best difference on all rows last."""

import json
import subprocess
import sys
from pathlib import Path

from posttrain.recipes import EPISODES, Recipe
from posttrain.recipes.table import recipe_table

REPO = Path(__file__).resolve().parents[2]


def evaluation(directory: Path, successes: dict[str, list[bool]]) -> Path:
    """An episodes file: per category, one item a success."""
    directory.mkdir()
    rows = [{"data_source": "toy", "ground_truth": f"{category}{index}", "success": success,
             "extra_info": {"index": index, "category": category},
             "messages": [{"role": "user", "content": f"{category} {index}"}, {"role": "assistant", "content": "x"}]}
            for category, items in successes.items() for index, success in enumerate(items)]
    (directory / EPISODES).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def report(tmp_path: Path, name: str, before: dict[str, list[bool]], after: dict[str, list[bool]]) -> Path:
    """A recipe's report.md in ``tmp_path/name``, as `posttrain recipe` writes it."""
    recipe = Recipe(name, "", [], rows={"SFT": "sft_eval", f"RL {name}": "rl_eval"}, compare=[["sft_eval", "rl_eval"]], by="category")
    (tmp_path / name).mkdir()
    dirs = {"sft_eval": evaluation(tmp_path / name / "sft", before), "rl_eval": evaluation(tmp_path / name / "rl", after)}
    path = tmp_path / name / "report.md"
    path.write_text("# Recipe\n\n" + recipe_table(recipe, dirs, {"rl": 60.0}))
    return path


def runs_table(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "runs_table.py"), *map(str, files)],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_each_reports_differences_sit_under_their_own_columns_and_the_best_is_last(tmp_path):
    # "gain": simple 2 of 4 → 4 of 4 (+0.5), irrelevance unchanged; all rows 4 of 8 → 6 of 8 (+0.25)
    gain = report(tmp_path, "gain", {"simple": [True, True, False, False], "irrelevance": [True, True, False, False]},
                  {"simple": [True] * 4, "irrelevance": [True, True, False, False]})
    # "loss": no irrelevance rows at all; simple 4 of 4 → 3 of 4; an "extra" item only the SFT evaluation has
    loss = report(tmp_path, "loss", {"simple": [True] * 4, "extra": [True]}, {"simple": [True, True, True, False]})
    done = runs_table(gain, loss)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["file", "row", "all", "category=irrelevance", "category=simple", "category=extra"]
    table = {cells[0]: dict(zip(header, cells)) for line in lines[2:-1]
             for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}
    assert set(table) == {"gain/report", "loss/report"} and table["gain/report"]["row"] == "RL gain − SFT"
    gained, lost = table["gain/report"], table["loss/report"]
    assert gained["all"].startswith("+0.250 [") and gained["category=simple"].startswith("+0.500 [")
    assert gained["category=irrelevance"].startswith("+0.000 [") and gained["category=extra"] == ""  # no such column
    assert lost["all"].startswith("-0.250 [") and lost["category=irrelevance"] == ""
    assert lost["category=extra"] == "—"  # the column is there, but the two evaluations share none of its items
    assert lines[-1] == "runs_table_best_all: +0.250"


def test_a_file_without_compared_rows_is_refused_by_name(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("| | all |\n|---|---|\n| SFT | 0.500 [0.2, 0.8] (n=4) |\n")
    done = runs_table(plain)
    assert done.returncode != 0 and "no row ending in '(paired)'" in done.stderr and "plain.txt" in done.stderr


def test_a_compared_row_that_does_not_read_is_refused_naming_its_line(tmp_path):
    broken = tmp_path / "broken.txt"  # a label with a "|" in it: one cell too many
    broken.write_text("| | all |\n|---|---|\n| RL | B − SFT | +0.100 [+0.000, +0.200] (paired) |\n")
    done = runs_table(broken)
    assert done.returncode != 0 and "broken.txt line 3: a compared row that does not read" in done.stderr
