"""scripts/bfcl_churn.py: the rows a second BFCL evaluation fixed and broke against a first, per category, and
the kinds of mistake they moved between, judged by BFCL's own checker."""

import subprocess
import sys

from tests.optional import require
from tests.scripts.test_bfcl_errors import REPO, two_evaluations

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')


def churn(first, second) -> list[list[list[str]]]:
    """The script's output as blocks (split at blank lines), each a list of lines, each a table row's cells (or the
    line alone); the header and rule rows left out."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_churn.py"), str(first), str(second)],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    return [[[cell.strip() for cell in line.strip("|").split("|")] if line.startswith("|") else [line] for line in block.splitlines()[2 if block.startswith("|") else 0:]]
            for block in done.stdout.strip().split("\n\n")]


def test_fixed_and_broken_rows_per_category_and_the_kinds_they_moved_between(tmp_path):
    """``calls`` answers 3 of 4 simple_python rows right (no call on the 4th) and both irrelevance rows right; ``silent``
    makes no call on the 4 simple_python rows and a call on the first irrelevance row. From silent to calls: 3
    simple_python rows and 1 irrelevance row fixed, none broken; the other way round, the same rows broken."""
    calls, silent = two_evaluations(tmp_path)
    counts, moves, last = churn(silent, calls)
    assert counts == [["irrelevance", "1", "0", "+1"], ["simple_python", "3", "0", "+3"], ["all", "4", "0", "+4"]]
    assert moves == [["no call → right", "3"], ["call on irrelevance row → right", "1"]]
    assert last == [["bfcl_churn_net: +4"]]
    counts, moves, last = churn(calls, silent)
    assert counts[-1] == ["all", "0", "4", "-4"] and last == [["bfcl_churn_net: -4"]]
    assert moves == [["right → no call", "3"], ["right → call on irrelevance row", "1"]]


def test_a_row_in_one_file_only_is_left_out_and_counted(tmp_path):
    calls, silent = two_evaluations(tmp_path)
    calls.write_text("".join(calls.read_text().splitlines(keepends=True)[1:]))  # its first simple_python row gone
    counts, moves, alone, last = churn(silent, calls)
    assert counts[-1] == ["all", "3", "0", "+3"] and last == [["bfcl_churn_net: +3"]]  # 2 simple_python rows and 1 irrelevance
    assert alone == [["rows in one file only, left out: 1"]]


def test_a_category_of_one_row_is_counted_and_an_item_answered_twice_refused(tmp_path):
    calls, silent = two_evaluations(tmp_path)
    for path in (calls, silent):  # the first simple_python row and the first irrelevance row alone
        lines = path.read_text().splitlines(keepends=True)
        path.write_text(lines[0] + lines[4])
    counts, moves, last = churn(silent, calls)
    assert counts == [["irrelevance", "1", "0", "+1"], ["simple_python", "1", "0", "+1"], ["all", "2", "0", "+2"]]
    calls.write_text(calls.read_text() * 2)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_churn.py"), str(silent), str(calls)],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "appears more than once: give greedy evaluations" in done.stderr
