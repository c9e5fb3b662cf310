"""DAPO's dynamic sampling and overlong reward shaping through the real CLI on the tiny model, in
sync and async mode: a reward that is flat for half the prompts makes the steps drop groups and
generate more rounds, the trained batch still holds data.train_batch_size groups, and the responses
(the tiny model always fills its 16 tokens) lose the whole penalty."""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from posttrain.config import load_config
from posttrain.models import cached_tiny_model
from posttrain.trainer.data_setup import resolve_files
from tests.e2e.cli_runs import records, run
from tests.e2e.test_train_cli import DEFAULT_SKIP, TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# flat (all samples 0) for prompts whose answer is even; varied (the share of vowels) for the others
HALF_FLAT = '''
def compute_score(solution_str, ground_truth):
    if int(float(ground_truth)) % 2 == 0:
        return 0.0
    return sum(c in "aeiou" for c in solution_str) / max(len(solution_str), 1)
'''


def command(run_dir: Path, *overrides: str) -> list[str]:
    reward = run_dir.parent / f"{run_dir.name}_half_flat.py"
    reward.write_text(HALF_FLAT)
    return [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, "data.builtin_options.train_size=24", "trainer.total_training_steps=2",
        "trainer.total_epochs=4", "trainer.val_before_train=false", "trainer.test_freq=-1", f"custom_reward_function.path={reward}",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=4",
        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.penalty_factor=0.5",
        DEFAULT_SKIP, *overrides,  # the kept groups vary: the update has samples to run
        # bfloat16 on every machine: the sampled tokens then do not depend on whether the CPU has native bf16
        # (in float32, where it has not, one sample of the sync run drew eos after 13 tokens)
        "actor_rollout_ref.actor.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dynamic_sampling_fills_the_batch_with_groups_whose_rewards_vary(tmp_path, mode):
    done = run(command(tmp_path / mode, f"trainer.mode={mode}", "actor_rollout_ref.rollout.name=" + ("hf" if mode == "sync" else "vllm")))
    assert done.returncode == 0, done.stdout[-4000:]
    steps = records(tmp_path / mode)
    assert [r["step"] for r in steps] == [1, 2]
    rounds = [r["metrics"]["dynamic_sampling/rounds"] for r in steps]
    assert sum(r["metrics"]["dynamic_sampling/dropped_groups"] for r in steps) >= 1  # the even answers' flat groups
    for record in steps:
        metrics = record["metrics"]
        assert 1 <= metrics["dynamic_sampling/rounds"] <= 4
        assert metrics["dynamic_sampling/rounds"] == 1 or metrics["dynamic_sampling/dropped_groups"] >= 1  # a round more only for a reason
        if metrics["dynamic_sampling/kept_groups"] == 4:  # full: 4 groups of 2 trained
            assert metrics["response_length/mean"] == 16
        assert metrics["reward/overlong_fraction"] == 1.0 and metrics["reward/overlong_penalty/mean"] == -0.5
    assert max(rounds) >= 2, rounds  # a round was not enough at least once (half the prompts are flat)
    # every round drew 4 of the 24 training rows (sync: those alone; async: the generators may draw ahead)
    for k, record in enumerate(steps, start=1):
        share, drawn = record["metrics"]["training/rows_drawn"], min(1.0, 4 * sum(rounds[:k]) / 24)
        assert share == pytest.approx(drawn) if mode == "sync" else share >= drawn, (k, share, rounds)
    trained = [json.loads(line) for line in (tmp_path / mode / "trained_prompts.jsonl").read_text().splitlines()]
    assert len(trained) == 2
    # only the varied groups trained: every prompt a step trained has an odd answer (the even ones' groups
    # are flat), one per kept group
    answers = ground_truths(tmp_path / mode)
    for record, step in zip(trained, steps):
        kept = step["metrics"]["dynamic_sampling/kept_groups"]
        assert kept >= 1 and len(record["prompts"]) == kept, (record, step["metrics"])
        rows = [int(uid.split(":")[1]) for uid in record["prompts"]]
        assert all(int(float(answers[row])) % 2 == 1 for row in rows), [answers[row] for row in rows]


def ground_truths(run_dir: Path) -> list[str]:
    """The answer of each row of the run's training set (the built-in dataset its config.yaml names)."""
    (train_file,), _ = resolve_files(load_config([run_dir / "config.yaml"]).data)
    rows = pq.read_table(train_file, columns=["reward_model"]).to_pylist()
    assert len(rows) == 24
    return [row["reward_model"]["ground_truth"] for row in rows]


def test_kl_groups_train_some_dropped_groups_beside_the_kept_ones(tmp_path):
    """``filter_groups.kl_groups``: up to that many flat groups (the even answers') join each step's batch, for the
    KL loss to the reference; the update splits the larger batch and the step trains their prompts too."""
    run_dir = tmp_path / "kl_groups"
    done = run(command(run_dir, "trainer.mode=sync", "actor_rollout_ref.rollout.name=hf", "algorithm.filter_groups.kl_groups=2",
                       "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1"))
    assert done.returncode == 0, done.stdout[-4000:]
    steps = records(run_dir)
    trained = [json.loads(line) for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]
    answers = ground_truths(run_dir)
    assert [r["step"] for r in steps] == [1, 2] and len(trained) == 2
    for record, step in zip(trained, steps):
        metrics = step["metrics"]
        kept, flat = metrics["dynamic_sampling/kept_groups"], metrics["dynamic_sampling/kl_groups"]
        assert flat == min(2, metrics["dynamic_sampling/dropped_groups"]) and len(record["prompts"]) == kept + flat, (record, metrics)
        parity = [int(float(answers[int(uid.split(":")[1])])) % 2 for uid in record["prompts"]]
        assert parity == [1] * int(kept) + [0] * int(flat), parity  # the varied groups first, then the flat ones
        assert metrics["actor/kl_loss"] >= 0
    assert sum(step["metrics"]["dynamic_sampling/kl_groups"] for step in steps) >= 1
