"""A difficulty curriculum through the real CLI (tiny model, Hugging Face generate, local Ray): arithmetic
prepared at two levels (1 and 2 digits), a reward that is always right, so the level steps up every
window; the batches hold the current level's problems, and a run stopped and resumed carries its level
and window on (the exact data position across a resume: tests/data/test_sampler.py)."""

import json
import re
from pathlib import Path

import pytest

from tests.e2e import cli_runs
from tests.e2e.test_train_cli import HF_ROLLOUT, run_train

pytestmark = [pytest.mark.slow, pytest.mark.ray]

CURRICULUM = [
    "data.builtin_options.levels=1,2", "data.builtin_options.train_size=8", "data.builtin_options.val_size=2",
    "data.sampler.curriculum.key=extra_info.level", "data.sampler.curriculum.threshold=0.9", "data.sampler.curriculum.window=2",
    "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.rollout_data_dir=rollouts", HF_ROLLOUT,
]


def always_right(tmp_path: Path) -> str:
    reward = tmp_path / "always_right.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    return f"custom_reward_function.path={reward}"


def digits_per_step(run_dir: Path, steps: int) -> list[set[int]]:
    """The operands' digit counts in each step's problems, read from the samples the step wrote."""
    found = []
    for step in range(1, steps + 1):
        rows = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        questions = [row["messages"][0]["content"] for row in rows]
        found.append({len(number) for q in questions for number in re.findall(r"\d+", q.split("?")[0])})
    return found


def trained(run_dir: Path) -> list[list[str]]:
    return [json.loads(line)["prompts"] for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]


def test_the_level_steps_up_each_window_and_a_resumed_run_carries_the_level_on(tmp_path):
    reward, run_dir = always_right(tmp_path), tmp_path / "run"
    run_train(run_dir, *CURRICULUM, reward, "trainer.total_training_steps=1", "trainer.save_freq=1")
    run_train(run_dir, *CURRICULUM, reward, "trainer.total_training_steps=4")  # resumes from step 1's checkpoint
    records = cli_runs.records(run_dir)
    # up after step 2: step 1's checkpoint holds half a window, which step 2 completes
    assert [r["metrics"]["curriculum/level"] for r in records] == [0, 0, 1, 1]
    assert all(r["metrics"]["curriculum/accuracy"] == 1.0 for r in records)
    # 1-digit problems (0-9) while at the first level, then 2 digits
    assert digits_per_step(run_dir, 4) == [{1}, {1}, {2}, {2}]
    rows = [uid.rsplit(":", 1)[1] for step in trained(run_dir) for uid in step]
    assert len(rows) == len(set(rows)) == 16  # two steps of 4 at each level of 8 rows: each row once, across the resume
