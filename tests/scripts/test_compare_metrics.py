"""scripts/compare_metrics.py: two runs' metrics compared step by step, as a person would hold the two files
side by side; ``--shared`` leaves out the counters only one of the runs logs."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*arguments):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "compare_metrics.py"), *map(str, arguments)],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_shared_compares_only_what_both_runs_log(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"step": s, "metrics": {"actor/loss": 0.5, "tool/calls": 3.0, "timing_s/step": s}}) + "\n" for s in (1, 2)))
    b.write_text("".join(json.dumps({"step": s, "metrics": {"actor/loss": 0.5 if s == 1 else 0.7, "program/requests": 4.0,
                                                            "timing_s/step": 2 * s}}) + "\n" for s in (1, 2)))
    every = run(a, b)
    assert every.returncode == 1 and "step 1 tool/calls: 3.0 vs missing" in every.stdout
    shared = run(a, b, "--shared")
    assert shared.returncode == 1
    assert shared.stdout.splitlines() == ["step 2 actor/loss: 0.5 vs 0.7", "2 records, 2 values compared (wall-clock metrics skipped), 1 differ"]
