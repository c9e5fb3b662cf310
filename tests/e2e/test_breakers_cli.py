"""The real CLI stops a run whose every reward fails, before training on the zeros."""

import json
import os
import subprocess
import sys

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.test_train_cli import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_a_reward_function_that_always_raises_stops_the_run_at_its_first_step(tmp_path):
    reward = tmp_path / "broken_reward.py"
    reward.write_text("def compute_score(solution_str, ground_truth):\n    raise KeyError('answer')\n")
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={tmp_path / 'run'}", *TINY_RUN, "actor_rollout_ref.rollout.name=hf",
        "trainer.val_before_train=false", "trainer.total_training_steps=2", f"custom_reward_function.path={reward}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "circuit breaker 'reward': 8 of 8 rewards errored or timed out in step 1 (first: sample 0: KeyError: 'answer'" in output
    metrics = tmp_path / "run" / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
    assert steps == []  # nothing was trained or logged from the failed step
