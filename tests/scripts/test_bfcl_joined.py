"""scripts/bfcl_joined.py: how often evaluations answer a one-call question with several calls, apart for the questions
that join two arguments' values with "and" and the others, judged by BFCL's own checker."""

import json
import subprocess
import sys

from tests.optional import require
from tests.scripts.test_bfcl_errors import REPO, as_calls

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.data.preparers.bfcl import load_category  # noqa: E402
from posttrain.data.preparers.bfcl_added import joins_values  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402


def _episode(question, answer: str, index: int) -> str:
    row = {"data_source": "bfcl", "messages": [*question.messages, {"role": "assistant", "content": answer}],
           "ground_truth": json.dumps(question.ground_truth), "success": None,
           "extra_info": {"index": index, "id": question.id, "category": question.category, "bfcl_functions": json.dumps(question.functions)}}
    return json.dumps(row) + "\n"


def test_several_calls_on_one_call_rows_apart_by_shape(tmp_path):
    """``once`` answers a joined question ("a base of 10 units and height of 5 units"), two other one-call questions and
    a parallel one (left out: two calls are due) right; ``twice`` makes the joined question's right call twice, and one
    other question's: on the joined row right 0, several calls 1; on the others right 0.5, several 0.5."""
    simple = load_category("simple_python")
    joined = next(q for q in simple if joins_values(q))
    others = [q for q in simple if not joins_values(q)][:2]
    parallel = load_category("parallel")[0]
    questions = [joined, *others, parallel]
    right = [as_calls(bfcl.answer_calls(q.ground_truth, q.functions)) for q in questions]
    files = {"once": right, "twice": [right[0] * 2, right[1] * 2, right[2], right[3]]}
    for label, answers in files.items():
        (tmp_path / f"{label}.jsonl").write_text("".join(_episode(q, a, i) for i, (q, a) in enumerate(zip(questions, answers))))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_joined.py"), *(f"{k}={tmp_path / k}.jsonl" for k in files)],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in done.stdout.splitlines()[2:] if line.startswith("|")]
    assert rows == [["once", "joined", "1", "1.000", "0.000"], ["once", "other", "2", "1.000", "0.000"],
                    ["twice", "joined", "1", "0.000", "1.000"], ["twice", "other", "2", "0.500", "0.500"]]
    assert done.stdout.strip().splitlines()[-1] == "bfcl_joined_several_calls: 1.000"


def test_bad_arguments_say_how_to_call_it(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_joined.py"), "no-label"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "bfcl_joined.py SFT=" in done.stderr
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_joined.py"), f"A={tmp_path / 'missing.jsonl'}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "bfcl_joined:" in done.stderr and "missing.jsonl" in done.stderr
    question = load_category("simple_python")[0]
    row = json.loads(_episode(question, "", 0))
    (tmp_path / "no_truth.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "ground_truth"}) + "\n")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_joined.py"), f"A={tmp_path / 'no_truth.jsonl'}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "no_truth.jsonl: BFCL row 1 has no ground_truth as JSON text" in done.stderr
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_joined.py"), f"A={tmp_path / 'x'}", f"A={tmp_path / 'y'}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "a label given twice (A)" in done.stderr
