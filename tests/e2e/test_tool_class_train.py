"""A user's tool class, end to end: `posttrain train` on the tiny model taught to call ``multiply(7, 6)``
(tests/e2e/test_tool_agent.py), with ``multiply`` a method of the user's class, one instance per
episode: each episode's reward() counts the calls its own instance saw, every instance is closed, and
no episode process is left when the run ends."""


import psutil
import pytest

from tests.e2e.cli_runs import episodes, records
from tests.e2e.test_tool_agent import posttrain, tool_calling_model

pytestmark = [pytest.mark.slow, pytest.mark.ray]

USER_CLASS = '''
import os
import uuid
from typing import Literal

EVIDENCE = EVIDENCE_DIR


class Multiplier:
    def reset(self, ground_truth: str) -> str:
        self.calls = 0
        self.marker = os.path.join(EVIDENCE, f"{os.getpid()}-{uuid.uuid4().hex}")
        open(self.marker + ".open", "w").close()
        return ""

    def multiply(self, a: int, b: int, rounding: Literal["exact", "thousands"] = "exact") -> str:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
            rounding: Whether to round the product to thousands.
        """
        self.calls += 1
        product = a * b
        return str(round(product, -3) if rounding == "thousands" else product)

    def reward(self) -> float:
        return float(self.calls)  # this episode's calls only: a shared instance would count the others'

    def close(self) -> None:
        os.rename(self.marker + ".open", self.marker + ".closed")
'''


def test_a_users_tool_class_is_trained_on_one_instance_per_episode(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (tmp_path / "my_env.py").write_text(USER_CLASS.replace("EVIDENCE_DIR", repr(str(evidence))))
    run_dir = tmp_path / "run"
    done = posttrain(
        "train", "--preset", "tool_grpo", f"actor_rollout_ref.model.path={tool_calling_model()}", f"trainer.default_local_dir={run_dir}",
        f"env.tools=[{tmp_path / 'my_env.py'}:Multiplier]",
        "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.longer_size=2",
        "data.builtin_options.sft_size=0", "data.builtin_options.sft_val_size=0",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625",
        "env.max_turns=1", "env.max_turn_tokens=40", "data.max_response_length=192",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.logger=[console,jsonl]",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logged = records(run_dir)
    for record in logged[1:]:
        metrics = record["metrics"]
        assert metrics["agent/episodes"] == 8 and metrics["agent/out_of_tokens_ratio"] == 0
        assert metrics["tool/successes"] >= 1 and metrics["tool/lost_instances"] == 0
        # each episode's score is its own instance's count of calls: together, the step's successful calls
        assert metrics["critic/score/mean"] * 8 == pytest.approx(metrics["tool/successes"])
    validated = [row for step in (0, 2) for row in episodes(run_dir / "validation" / f"step_{step}.jsonl")]
    # every episode's instance was made and closed, in a process that is gone with the run
    closed = sorted(evidence.glob("*.closed"))
    assert not list(evidence.glob("*.open")) and len(closed) == 2 * 8 + len(validated)
    pids = {int(path.name.split("-")[0]) for path in closed}
    assert len(pids) == len(closed)  # a process per episode
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
