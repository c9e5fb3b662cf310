"""scripts/call_decision.py: whether a policy tells the rows that need a call from the irrelevance rows
better than another, or only calls more often, from a margin per row a person can recompute."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "call_decision.py"
spec = importlib.util.spec_from_file_location("call_decision", SCRIPT)
call_decision = importlib.util.module_from_spec(spec)
spec.loader.exec_module(call_decision)


def table(text: str, header: str) -> list[list[str]]:
    """The body rows (cells) of the Markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return body


def test_the_area_under_the_curve_counts_pairs_and_the_shift_reaches_a_call_rate():
    assert call_decision.auc(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0])) == (1 + 0.5 + 2 + 2) / 6  # a tie counts half
    assert call_decision.auc(np.array([0.0]), np.array([1.0])) == 0.0
    margins = np.array([3.0, 2.0, 1.0, 0.5, -1.0, -2.0])
    for rate in (0.0, 0.5, 5 / 6, 1.0):
        low, high = call_decision.shifts_for_rate(margins, rate)
        inside = [x for x in np.linspace(max(low, -9), min(high, 9), 7)[1:-1]]
        assert inside and all((margins + x > 0).mean() == rate for x in inside)
    assert call_decision.calls_within(np.array([-0.4, -0.2, 0.1]), (0.25, 0.45)) == (2, 3)


def test_a_threshold_moved_along_the_same_curve_is_told_from_better_separation():
    rng = np.random.default_rng(1)
    needs_call = np.array([True] * 300 + [False] * 100)
    sft = np.where(needs_call, rng.normal(1.0, 1.0, 400), rng.normal(-1.0, 1.0, 400))
    models = {"SFT": sft, "moved": sft + 1.5, "separated": np.where(needs_call, sft + 1.5, sft - 1.0)}
    text = call_decision.report(models, needs_call, resamples=200)
    assert text.startswith("300 rows need a call, 100 are irrelevance rows.")
    own = {row[0]: row for row in table(text, "| model |")}
    assert own["moved"][1].split()[0] == own["SFT"][1].split()[0]  # a constant added to every margin: the same ranking
    assert float(own["moved"][2]) > float(own["SFT"][2]) and int(own["moved"][3].split()[0]) > int(own["SFT"][3].split()[0])
    differences = {row[0]: row[1] for row in table(text, "| | AUC difference")}
    assert differences["moved − SFT"] == "+0.000 [+0.000, +0.000]"
    low = float(differences["separated − SFT"].split("[")[1].split(",")[0])
    assert low > 0  # separated better: the paired interval lies above 0
    shifted = {row[0]: row for row in table(text, "| shifted to |")}
    fewest, *most = shifted["moved"][3].split(" of ")[0].split(" to ")
    assert shifted["moved"][2] == own["moved"][2] and int(fewest) <= int(shifted["moved"][4]) <= int((most or [fewest])[0])  # SFT shifted is "moved"
    assert int(shifted["separated"][3].split()[0]) > int(shifted["separated"][4])  # at the same call rate, more stray calls than separated's


def test_the_script_scores_rows_with_their_own_functions_on_a_model_directory(tmp_path):
    from posttrain.models import cached_tiny_model

    model = cached_tiny_model("llama")
    tools = json.dumps([{"type": "function", "function": {"name": "area", "description": "a triangle's area",
                                                          "parameters": {"type": "object", "properties": {"base": {"type": "number"}}}}}])
    rows = [("simple_python", "What is the area of a triangle of base 3?", '<tool_call>{"name": "area", "arguments": {"base": 3}}</tool_call>'),
            ("simple_python", "Area for base 4?", "I cannot."),
            ("irrelevance", "Who wrote Hamlet?", "None of the functions I have can do this.")]
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("".join(json.dumps({"data_source": "bfcl", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                            "extra_info": {"id": f"row_{i}", "category": c, "tools": tools}}) + "\n"
                                for i, (c, q, a) in enumerate(rows)))

    def run(*arguments):
        return subprocess.run([sys.executable, str(SCRIPT), "--episodes", str(episodes), *arguments], capture_output=True, text=True,
                              cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "", "HF_HUB_OFFLINE": "1"})

    done = run(f"A={model}", f"B={model}", f"--check=A={episodes}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("2 rows need a call, 1 are irrelevance rows.")
    assert {row[0]: row[1] for row in table(done.stdout, "| | AUC difference")} == {"B − A": "+0.000 [+0.000, +0.000]"}
    margins = call_decision.margins(str(model), call_decision.read_rows(episodes))
    greedy_calls = (margins > 0).tolist()
    agree = sum(g == a for g, a in zip(greedy_calls, [True, False, False])) / 3  # the episodes' answers: a call, then none
    assert f"A: its margin agrees with its evaluation's greedy answers (call or not) on {agree:.3f} of 3 rows" in done.stdout
    lines = episodes.read_text().splitlines(keepends=True)
    (tmp_path / "due.jsonl").write_text("".join(lines[:2]))
    (tmp_path / "irrelevant.jsonl").write_text(lines[2])
    done = subprocess.run([sys.executable, str(SCRIPT), "--episodes", str(tmp_path / "due.jsonl"), "--episodes", str(tmp_path / "irrelevant.jsonl"),
                           f"A={model}"], capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and done.stdout.startswith("2 rows need a call, 1 are irrelevance rows."), done.stderr  # both files' rows
    done = run(f"A={model}", "--check=C=x.jsonl")
    assert done.returncode == 2 and "--check names ['C'], which are not among the models" in done.stderr
    episodes.write_text(episodes.read_text().replace('"simple_python"', '"irrelevance"'))
    done = run(f"A={model}")
    assert done.returncode == 1 and "the rows need both kinds" in done.stderr
