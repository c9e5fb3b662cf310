"""Resuming through the real CLI (tiny model, HF rollout, local Ray): a run stopped at step k and
resumed gives exactly the uninterrupted run's metrics (resumed at an epoch boundary and within an
epoch), records each step once and reports from the run's first validation. (The last step's
checkpoint without save_freq, and a finished run not trained again: test_grpo_two_steps in
tests/e2e/test_train_cli.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model
from scripts.compare_metrics import PER_PROCESS
from tests.e2e.test_train_cli import DEFAULT_SKIP, TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# Rewards that vary between responses even for the untrained tiny model (its arithmetic scores are
# all 0, so advantages and gradients would be 0 and every step would leave the weights as they were).
VOWEL_REWARD = '''
def compute_score(solution_str, ground_truth):
    return sum(c in "aeiou" for c in solution_str) / max(len(solution_str), 1)
'''
# Timings, throughputs and each process's resident memory differ between any two runs; nothing else may.
UNTIMED = ("timing_s/", "timing_per_token_ms/", "perf/", *PER_PROCESS)


def cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    reward = run_dir.parent / "vowels.py"
    reward.write_text(VOWEL_REWARD)
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, DEFAULT_SKIP, "actor_rollout_ref.rollout.name=hf",
        f"custom_reward_function.path={reward}", "trainer.total_epochs=2", *overrides,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def records(run_dir: Path) -> dict[int, dict[str, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines]
    assert len(steps) == len(set(steps)), f"a step recorded twice: {steps}"
    return {r["step"]: {k: v for k, v in r["metrics"].items() if not k.startswith(UNTIMED)} for r in lines}


def test_a_resumed_run_gives_the_uninterrupted_runs_metrics(tmp_path):
    """8 prompts in batches of 4: steps 1-2 are epoch 0, step 3 epoch 1. After the uninterrupted
    run, (a) it is made to look killed while saving step 3 (logged, not committed) and run again
    with the same command: it resumes at the epoch boundary (step 2); (b) it is resumed from step 1
    (mid-epoch) by path. Each time every later step's metrics — rewards, advantages, losses, grad
    norm, entropy, the step-3 validation — are exactly (==) the uninterrupted run's, each step is
    recorded once, and the checkpoints after the resumed step are moved aside."""
    run_dir = tmp_path / "run"
    overrides = ["trainer.total_training_steps=3", "trainer.save_freq=1"]
    cli(run_dir, *overrides)
    uninterrupted = records(run_dir)
    assert sorted(uninterrupted) == [0, 1, 2, 3]
    assert uninterrupted[3]["training/epoch"] == 1 and uninterrupted[2]["training/epoch"] == 0
    assert all(uninterrupted[s]["actor/grad_norm"] > 0 and uninterrupted[s]["critic/score/mean"] > 0 for s in (1, 2, 3))
    first_report = (run_dir / "report" / "report.md").read_text()

    checkpoints = run_dir / "checkpoints"
    # (a) what a kill while step 3 was being saved leaves: its directory partial, the pointer at 2
    (checkpoints / "global_step_3").rename(checkpoints / "global_step_3.partial")
    (checkpoints / "global_step_3.partial" / "manifest.json").unlink()
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    # (b) resumed by path from an older step: steps 2 and 3 of (a) become an abandoned branch
    for resume_at, extra, abandoned in ((2, [], []), (1, [f"trainer.resume_mode={checkpoints}/global_step_1"], ["global_step_2", "global_step_3"])):
        done = cli(run_dir, *overrides, *extra)
        assert f"resumed from {checkpoints}/global_step_{resume_at} (step {resume_at})" in done.stdout
        resumed = records(run_dir)  # no step twice: the steps logged after the resumed one were dropped
        assert sorted(resumed) == [0, 1, 2, 3]
        for step in range(resume_at + 1, 4):
            assert resumed[step] == uninterrupted[step], step
        assert sorted(p.name for p in (checkpoints / "abandoned").glob("*")) == abandoned
        assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "3"
        assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("global_step_")) == [f"global_step_{s}" for s in (1, 2, 3)]

    # The report and the summary start from the run's first validation (step 0), not the resume's.
    report = (run_dir / "report" / "report.md").read_text()
    assert "(step 0) →" in report and "(step 3)" in report
    first_samples = first_report[first_report.index("## First validation"):first_report.index("## Last validation")]
    assert first_samples in report
