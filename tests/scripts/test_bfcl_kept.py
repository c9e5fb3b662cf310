"""scripts/bfcl_kept.py: what an rl stage's updates saw on BFCL rows (the step files trainer.rollout_data_dir writes), by
how many calls each row's possible answer holds: samples with fewer or more calls than wanted, and the advantage of those
with more."""

import json
import subprocess
import sys

from tests.optional import require
from tests.scripts.test_bfcl_errors import REPO, as_calls

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.data.preparers.bfcl import load_category  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402


def _sample(question, answer: str, uid: str, advantage: float, ground_truth=None) -> dict:
    truth = question.ground_truth if ground_truth is None else ground_truth
    return {"data_source": "bfcl", "messages": [*question.messages, {"role": "assistant", "content": answer}],
            "ground_truth": json.dumps(truth), "reward": 0.0, "success": False, "stats": {}, "uid": uid, "advantage": advantage,
            "extra_info": {"category": question.category, "bfcl_functions": json.dumps(question.functions)}}


def _run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_kept.py"), *arguments],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_samples_by_wanted_calls_with_fewer_more_and_the_advantage_of_more(tmp_path):
    """Step 1: a one-call group (its right call, advantage +1; that call twice, −1) and a no-call group (a call, −0.5;
    none, +0.5); step 2: a two-call group (one of its calls, +0.25; both, −0.25). The whole folder: each wanted count
    one group of two samples, half with more calls (advantage −1 and −0.5) or, wanting two, half with fewer; steps 1-1:
    the first two groups alone; steps 2-2: the two-call group alone, so the headline (the last label's one-call rows) is "none", and the other order gives 0.5."""
    one, parallel = load_category("simple_python")[0], load_category("parallel")[0]
    right_one = as_calls(bfcl.answer_calls(one.ground_truth, one.functions))
    right_two = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert len(right_two) == 2
    steps = {1: [_sample(one, right_one, "0:1", 1.0), _sample(one, right_one * 2, "0:1", -1.0),
                 _sample(one, right_one, "0:2", -0.5, ground_truth=[]), _sample(one, "No function fits.", "0:2", 0.5, ground_truth=[])],
             2: [_sample(parallel, as_calls(right_two[:1]), "1:3", 0.25), _sample(parallel, as_calls(right_two), "1:3", -0.25)]}
    for step, rows in steps.items():
        (tmp_path / f"step_{step}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "notes.jsonl").write_text("not a step file\n")
    done = _run(f"ALL={tmp_path}", f"EARLY={tmp_path}@1-1", f"LATE={tmp_path}@2-2")
    assert done.returncode == 0, done.stderr
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in done.stdout.splitlines()[2:] if line.startswith("|")]
    assert rows == [["ALL", "0", "1", "2", "0.000", "0.500", "-0.500"], ["ALL", "1", "1", "2", "0.000", "0.500", "-1.000"],
                    ["ALL", "2", "1", "2", "0.500", "0.000", "—"], ["EARLY", "0", "1", "2", "0.000", "0.500", "-0.500"],
                    ["EARLY", "1", "1", "2", "0.000", "0.500", "-1.000"], ["LATE", "2", "1", "2", "0.500", "0.000", "—"]]
    assert done.stdout.strip().splitlines()[-1] == "bfcl_kept_extra_calls: none"
    done = _run(f"LATE={tmp_path}@2-2", f"ALL={tmp_path}")
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "bfcl_kept_extra_calls: 0.500", done.stderr


def test_bad_arguments_say_how_to_call_it(tmp_path):
    done = _run("no-label")
    assert done.returncode == 1 and "bfcl_kept.py RL=" in done.stderr
    done = _run(f"A={tmp_path}")
    assert done.returncode == 1 and f"bfcl_kept: {tmp_path}: no step_N.jsonl files" in done.stderr
    done = _run(f"A={tmp_path}@3")
    assert done.returncode == 1 and "the steps are FIRST-LAST" in done.stderr
    question = load_category("simple_python")[0]
    row = _sample(question, "", "0:1", 0.0)
    (tmp_path / "step_1.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "uid"}) + "\n")
    done = _run(f"A={tmp_path}")
    assert done.returncode == 1 and "step_1.jsonl: row 1 has no ground_truth as JSON text, uid or advantage" in done.stderr
    done = _run(f"A={tmp_path}", f"A={tmp_path}")
    assert done.returncode == 1 and "a label given twice (A)" in done.stderr
