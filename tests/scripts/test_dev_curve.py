"""scripts/dev_curve.py: each run's validation accuracies as its metrics file holds them, with Wilson
intervals a person can check, and the best last − first over the runs on the last line."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_run(run_dir: Path, accuracies: dict[int, float]) -> Path:
    run_dir.mkdir()
    lines = []
    for step in range(0, max(accuracies) + 1):
        metrics = {"critic/score/mean": 0.5}  # a training step's record: no validation in it
        if step in accuracies:
            metrics = {"val/arithmetic/acc/mean@1": accuracies[step], "val/arithmetic/reward/mean@1": accuracies[step] / 2,
                       "val/reward/samples": 40}
        lines.append(json.dumps({"step": step, "metrics": metrics}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_each_validation_with_its_interval_and_the_best_gain_last(tmp_path):
    slow = write_run(tmp_path / "slow", {0: 0.5, 5: 0.5, 10: 0.525})
    fast = write_run(tmp_path / "fast", {0: 0.5, 10: 0.75})
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), f"slow={slow}", f"fast={fast}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # 20 of 40: the Wilson interval is 0.352 to 0.648 (by hand: centre 0.5, half-width 1.96*sqrt(.25/40+1/(4*1600))/(1+3.84/40))
    assert "  step 0: acc 0.500 [0.352, 0.648] (n=40), reward 0.250" in lines
    assert [line for line in lines if line.startswith("  step")][:3] == [
        "  step 0: acc 0.500 [0.352, 0.648] (n=40), reward 0.250", "  step 5: acc 0.500 [0.352, 0.648] (n=40), reward 0.250",
        "  step 10: acc 0.525 [0.375, 0.671] (n=40), reward 0.263"]
    assert "slow: last - first: +0.025" in lines and "fast: last - first: +0.250" in lines
    assert lines[-1] == "dev_curve_best_last_minus_first: +0.250"


def test_by_a_field_gives_each_category_its_accuracy_and_change_from_the_validation_episodes(tmp_path):
    run = write_run(tmp_path / "run", {0: 0.5, 10: 0.75})
    episodes = {0: {"a": [1, 1, 0, 0], "b": [1, 1, 0, 0]}, 10: {"a": [1, 1, 1, 1], "b": [1, 1, 0, 0]}}
    (run / "validation").mkdir()
    for step, by_task in episodes.items():
        rows = [{"extra_info": {"task": task}, "success": bool(s), "reward": float(s), "stats": {}}
                for task, successes in by_task.items() for s in successes]
        (run / "validation" / f"step_{step}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), f"r={run}", "--by", "task"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # 4 of 4: Wilson [0.510, 1.000]; 2 of 4: [0.150, 0.850]; 6 of 8 (the validation's episodes, all rows): [0.409, 0.929]
    assert "    task=a acc 1.000 [0.510, 1.000] (n=4)" in lines and "    task=b acc 0.500 [0.150, 0.850] (n=4)" in lines
    assert lines.index("    task=a acc 0.500 [0.150, 0.850] (n=4)") < lines.index("  step 10: acc 0.750 [0.409, 0.929] (n=8), reward 0.375")
    assert "    task=a: +0.500" in lines and "    task=b: +0.000" in lines
    missing = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), f"r={write_run(tmp_path / 'bare', {0: 0.5})}", "--by", "task"],
                             capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert missing.returncode != 0 and "step_0.jsonl: no such file" in missing.stderr


def test_the_interval_counts_every_validation_row_unreadable_answers_too(tmp_path):
    # 30 of 40 rows right; the reward manager scored 38 answers (two unreadable: wrong, and not in val/reward/samples)
    run = write_run(tmp_path / "run", {0: 0.75})
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "metrics": {
        "val/bfcl/acc/mean@1": 0.75, "val/bfcl/reward/mean@1": 0.75, "val/reward/samples": 38}}) + "\n")
    (run / "validation").mkdir()
    (run / "validation" / "step_0.jsonl").write_text("".join(json.dumps({"success": i < 30}) + "\n" for i in range(40)))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), f"r={run}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    # 30 of 40: Wilson [0.598, 0.858] (the first test's by-hand figures); over the 38 scored it would read [0.608, 0.870] (n=38)
    assert "  step 0: acc 0.750 [0.598, 0.858] (n=40), reward 0.750" in done.stdout.splitlines()


def test_a_run_validated_once_has_no_change_unless_another_runs_first_validation_stands_for_its_step_0(tmp_path):
    warm = write_run(tmp_path / "warm", {0: 0.5, 10: 0.6})
    once = write_run(tmp_path / "once", {0: 0.5})
    later = write_run(tmp_path / "later", {10: 0.75})  # trainer.val_before_train=false: its first validation is its last

    def dev_curve(*arguments: str) -> list[str]:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), *arguments],
                              capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    alone = dev_curve(f"once={once}", f"later={later}")
    assert not any("+0.000" in line for line in alone)  # nothing to compare: no change printed as none
    assert any(line.startswith("later: one validation, no last - first") for line in alone)
    assert alone[-1] == "dev_curve_best_last_minus_first: none"
    shared = dev_curve(f"warm={warm}", f"later={later}", "--first-from", "warm")
    assert "warm: last - first: +0.100" in shared and "later: last - first (first: warm's step 0): +0.250" in shared
    assert shared[-1] == "dev_curve_best_last_minus_first: +0.250"
    refused = subprocess.run([sys.executable, str(REPO / "scripts" / "dev_curve.py"), f"later={later}", "--first-from", "base"],
                             capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert refused.returncode != 0 and "--first-from base: no run of that label" in refused.stderr
