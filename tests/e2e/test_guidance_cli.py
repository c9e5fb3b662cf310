"""Guidance from the data's reference answers (``algorithm.guidance``, rollout/guidance.py) through the real CLI on the
tiny model, with dynamic sampling as the bfcl recipe runs it: the tiny model answers no arithmetic row right, so
every group gets its row's reference (the built-in preparer writes one per training row), no group ties, one round
fills the batch, and the update learns from it; the step's scores and the validation stay the policy's own."""

import json
import sys

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, run
from tests.e2e.test_train_cli import DEFAULT_SKIP, HF_ROLLOUT, TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_groups_with_no_right_answer_learn_from_their_reference_and_are_not_dropped(tmp_path):
    run_dir = tmp_path / "run"
    done = run([
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, DEFAULT_SKIP, HF_ROLLOUT, "trainer.total_training_steps=2",
        "trainer.val_before_train=false", "algorithm.guidance.enable=true", "trainer.rollout_data_dir=rollouts",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3",
        # bfloat16 on every machine: the sampled tokens then do not depend on whether the CPU has native bf16
        "actor_rollout_ref.actor.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
    ])
    assert done.returncode == 0, done.stdout[-4000:]
    steps = records(run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        metrics = record["metrics"]
        assert metrics["critic/score/max"] == 0.0, metrics  # the policy's own answers: none right
        assert metrics["guidance/groups"] == 4 and metrics["guidance/unguided"] == 0, metrics  # so every group was given its reference
        assert metrics["dynamic_sampling/rounds"] == 1 and metrics["dynamic_sampling/dropped_groups"] == 0, metrics
        assert metrics["critic/score/uniform_groups"] == 0.0  # each group: a reference scored 1 beside a wrong answer
        assert metrics["actor/pg_loss"] != 0.0 and metrics["critic/advantages/max"] > 0, metrics  # the update learnt from them
        # the rows trained on (trainer.rollout_data_dir): in each group one reference, scored right, with a positive advantage
        rows = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{record['step']}.jsonl").read_text().splitlines()]
        guided = [row for row in rows if row["guided"]]
        assert len(guided) == 4 and len({row["uid"] for row in guided}) == 4, rows
        for row in guided:
            assert row["messages"][-1]["content"] == row["extra_info"]["reference_answer"] and row["reward"] == 1.0 and row["advantage"] > 0
        assert all(row["reward"] == 0.0 and row["advantage"] < 0 for row in rows if not row["guided"])
    validated = steps[-1]["metrics"]
    assert validated["val/arithmetic/acc/mean@1"] == 0.0, validated  # validation samples the policy alone: no reference there
