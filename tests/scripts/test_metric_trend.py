"""scripts/metric_trend.py: a run's metric averaged over its first and last training steps, as a person
would average the metrics file's numbers by hand."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_metric_trend_gives_the_first_and_last_windows_means(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": step, "metrics": {"critic/score/mean": float(step), "rounds": 2.0}} for step in range(1, 21)]
    records.insert(5, {"step": 5, "metrics": {"val/x/acc/mean@1": 0.5}})  # a validation's record: no training metrics
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "metric_trend.py"), str(run), "critic/score/mean", "rounds", "--window", "5"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    # steps 1-5 average 3, steps 16-20 average 18, all 20 average 10.5
    assert done.stdout.splitlines() == ["critic/score/mean: first 5 3.000, last 5 18.000, all 20 10.500",
                                        "rounds: first 5 2.000, last 5 2.000, all 20 2.000", "metric_trend_last_minus_first: +15.000"]


def test_each_lists_the_metric_at_every_step_in_order(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": step, "metrics": {"agent/success_rate": step / 4}} for step in (3, 1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "metric_trend.py"), str(run), "agent/success_rate", "--each", "--window", "1"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "agent/success_rate by step: 0.250 0.500 0.750"
