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


def _sample(question, answer: str, uid: str, advantage: float, reward: float, ground_truth=None, **more) -> dict:
    truth = question.ground_truth if ground_truth is None else ground_truth
    return {"data_source": "bfcl", "messages": [*question.messages, {"role": "assistant", "content": answer}],
            "ground_truth": json.dumps(truth), "reward": reward, "success": False, "stats": {}, "uid": uid, "advantage": advantage,
            "extra_info": {"category": question.category, "bfcl_functions": json.dumps(question.functions)}} | more


def _run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_kept.py"), *arguments],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_samples_by_wanted_calls_with_fewer_more_their_rewards_and_the_advantage_of_more(tmp_path):
    """Step 1: a one-call group (its right call; that call twice, reward 0.25, advantage −1; three times, 0.1, −0.5) and a
    no-call group (a call, 0, −0.5; none); step 2: a two-call group (one of its calls, reward 0.3; both; and a guided row,
    left out) and a group wanting five calls (six, reward 0.4, advantage +0.5; four, 0.6), counted under "4 or more".
    Steps 1-1 hold the first two groups, steps 2-2 the others, so the headline (the last label's one-call rows) is "none"
    after LATE and 0.667 after ALL."""
    one, parallel = load_category("simple_python")[0], load_category("parallel")[0]
    right_one = as_calls(bfcl.answer_calls(one.ground_truth, one.functions))
    right_two = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert len(right_two) == 2
    steps = {1: [_sample(one, right_one, "0:1", 1.0, 1.0), _sample(one, right_one * 2, "0:1", -1.0, 0.25),
                 _sample(one, right_one * 3, "0:1", -0.5, 0.1),
                 _sample(one, right_one, "0:2", -0.5, 0.0, ground_truth=[]), _sample(one, "No function fits.", "0:2", 0.5, 1.0, ground_truth=[])],
             2: [_sample(parallel, as_calls(right_two[:1]), "1:3", 0.25, 0.3), _sample(parallel, as_calls(right_two), "1:3", -0.25, 0.2),
                 _sample(parallel, as_calls(right_two), "1:3", 0.0, 1.0, guided=True),
                 _sample(one, right_one * 6, "1:4", 0.5, 0.4, ground_truth=one.ground_truth * 5),
                 _sample(one, right_one * 4, "1:4", -0.5, 0.6, ground_truth=one.ground_truth * 5)]}
    for step, rows in steps.items():
        (tmp_path / f"step_{step}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "notes.jsonl").write_text("not a step file\n")
    done = _run(f"ALL={tmp_path}", f"EARLY={tmp_path}@1-1", f"LATE={tmp_path}@2-2")
    assert done.returncode == 0, done.stderr
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in done.stdout.splitlines()[2:] if line.startswith("|")]
    first = [["0", "1", "2", "0.000", "—", "0.500", "0.000", "-0.500"], ["1", "1", "3", "0.000", "—", "0.667", "0.175", "-0.750"]]
    second = [["2", "1", "2", "0.500", "0.300", "0.000", "—", "—"], ["4 or more", "1", "2", "0.500", "0.600", "0.500", "0.400", "+0.500"]]
    assert rows == [["ALL", *r] for r in first + second] + [["EARLY", *r] for r in first] + [["LATE", *r] for r in second]
    assert done.stdout.strip().splitlines()[-1] == "bfcl_kept_extra_calls: none"
    done = _run(f"LATE={tmp_path}@2-2", f"ALL={tmp_path}")
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "bfcl_kept_extra_calls: 0.667", done.stderr


def test_bad_arguments_say_how_to_call_it(tmp_path):
    done = _run("no-label")
    assert done.returncode == 1 and "bfcl_kept.py RL=" in done.stderr
    done = _run(f"A={tmp_path}")
    assert done.returncode == 1 and f"bfcl_kept: {tmp_path}: no step_N.jsonl files" in done.stderr
    done = _run(f"A={tmp_path}@3")
    assert done.returncode == 1 and "the steps are FIRST-LAST" in done.stderr
    question = load_category("simple_python")[0]
    row = _sample(question, "", "0:1", 0.0, 0.0)
    (tmp_path / "step_1.jsonl").write_text(json.dumps(row | {"data_source": "gsm8k"}) + "\n")
    done = _run(f"A={tmp_path}")
    assert done.returncode == 1 and f"bfcl_kept: {tmp_path}: no sampled BFCL row in its step files" in done.stderr
    done = _run(f"A={tmp_path}@2-1")
    assert done.returncode == 1 and "the first step is after the last" in done.stderr
    (tmp_path / "step_1.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "uid"}) + "\n")
    done = _run(f"A={tmp_path}")
    assert done.returncode == 1 and "step_1.jsonl: BFCL row 1 has no ground_truth as JSON text, uid, advantage or reward" in done.stderr
    done = _run(f"A={tmp_path}", f"A={tmp_path}")
    assert done.returncode == 1 and "a label given twice (A)" in done.stderr
