"""scripts/bfcl_errors.py: each evaluation's mistakes by kind per category, judged by BFCL's own checker,
and the call rate on the rows that need a call, from episode files a person can read."""

import json
import subprocess
import sys
from pathlib import Path

from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.data.preparers.bfcl import load_category  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NO_CALL = "None of the functions I have can do this."


def episode(question, answer: str) -> str:
    row = {"messages": [{"role": "user", "content": "(the question)"}, {"role": "assistant", "content": answer}],
           "ground_truth": json.dumps(question.ground_truth),
           "extra_info": {"category": question.category, "bfcl_functions": json.dumps(question.functions)}}
    return json.dumps(row) + "\n"


def as_calls(calls: list[dict]) -> str:
    return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)


def test_mistakes_by_kind_and_the_call_rate_where_a_call_is_due(tmp_path):
    simple, irrelevance = load_category("simple_python")[:4], load_category("irrelevance")[:2]
    right = [as_calls(bfcl.answer_calls(q.ground_truth, q.functions)) for q in simple]
    stray = as_calls([{"name": irrelevance[0].functions[0]["name"], "arguments": {}}])
    calls = tmp_path / "calls.jsonl"  # 3 right calls and one missing; no call on either irrelevance row
    calls.write_text("".join([*(episode(q, a) for q, a in zip(simple[:3], right)), episode(simple[3], NO_CALL),
                              *(episode(q, NO_CALL) for q in irrelevance)]))
    silent = tmp_path / "silent.jsonl"  # never a call where one is due; a call on one irrelevance row
    silent.write_text("".join([*(episode(q, NO_CALL) for q in simple), episode(irrelevance[0], stray), episode(irrelevance[1], NO_CALL)]))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), f"calls={calls}", f"silent={silent}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    tables = {block.splitlines()[0]: [line.split() for line in block.splitlines()[2:]] for block in done.stdout.strip().split("\n\n")}
    assert tables["simple_python (4 rows)"] == [["right", "3", "0"], ["no", "call", "1", "4"],
                                                ["call", "rate", "where", "one", "is", "due", "0.750", "0.000"]]
    assert tables["irrelevance (2 rows)"] == [["right", "2", "1"], ["call", "on", "irrelevance", "row", "0", "1"]]
    assert tables["all (6 rows)"][-1] == ["call", "rate", "where", "one", "is", "due", "0.750", "0.000"]
