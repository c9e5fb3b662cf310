"""A rubric with a real judge end to end: a tiny model served by the Env-LLM worker on vLLM judges a tiny
policy's arithmetic (``posttrain train``, local Ray), checked against its rule before training, killed
mid-run and restarted; then ``posttrain eval`` twice over one reply cache, the second time every reply
read from it."""

import re
import sqlite3
import sys

import pytest

from posttrain.controller.faults import FAULT_DIR, KILL_AT
from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, run

pytestmark = [pytest.mark.slow, pytest.mark.ray]

JUDGED = """
reward:
  rubric:
    - {name: correct, weight: 1.0, rule: arithmetic}
    - name: judged_right
      weight: 0.5
      judge:
        prompt: 'Is "{answer}" the number {ground_truth}? Answer yes or no.'
        parser: yes_no
        rule: arithmetic
  judge: {min_agreement: 0.0, agreement_rows: 4}
"""

TINY_RUN = [
    "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.train_batch_size=4",
    "data.max_response_length=16", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "env.llm.max_tokens=4", "env.llm.max_model_len=256", "env.llm.cpu_kv_cache_gb=0.0625",
    "trainer.logger=[console,jsonl]", "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
]


def test_a_judge_scores_a_run_survives_its_death_and_replays_from_its_cache(tmp_path):
    tiny = str(cached_tiny_model("llama"))
    config = tmp_path / "judged.yaml"
    config.write_text(JUDGED)
    faults = tmp_path / "faults"
    faults.mkdir()
    run_dir = tmp_path / "run"
    # chat@1 is the agreement check, chat@2 step 1's judging, chat@3 step 2's: the judge dies there
    cli = [sys.executable, "-m", "posttrain.cli"]
    done = run([*cli, "train", "--config", str(config), f"actor_rollout_ref.model.path={tiny}", f"env.llm.model_path={tiny}",
                *TINY_RUN, f"trainer.default_local_dir={run_dir}", "trainer.save_freq=1", "trainer.max_restarts=1"],
               env={KILL_AT: "env_llm.chat@3", FAULT_DIR: str(faults)})
    assert done.returncode == 0, done.stdout[-4000:]
    assert re.search(r"judge part .judged_right. \(\S+\) agrees with its rule on \d\.\d\d of \d+ answers \(right ones", done.stdout), done.stdout[-4000:]
    assert [p.name for p in faults.iterdir()] == ["env_llm.chat@3"], done.stdout[-3000:]
    restarts = [line for line in done.stdout.splitlines() if line.startswith("posttrain: restart")]
    assert len(restarts) == 1 and "worker 'env_llm' rank 0 died during chat()" in restarts[0], done.stdout[-3000:]
    logged = records(run_dir)
    assert [r["step"] for r in logged] == [1, 2]  # each once: step 2 again after the restart, from step 1's checkpoint
    for record in logged:
        metrics = record["metrics"]
        asked = metrics["judge/replies"]  # the answers the rule did not accept: 8 samples a step
        assert 0 < asked <= 8 and metrics["judge/failures"] == 0 and metrics["judge/requests"] == 1
        assert 0.0 <= metrics["reward/judged_right"] <= 1.0 and metrics["reward/judged_right/unparsable"] <= asked
    with sqlite3.connect(run_dir / "judge_cache.sqlite") as db:  # the run's replies, kept for its resume
        assert db.execute("SELECT COUNT(*) FROM replies").fetchone()[0] >= logged[0]["metrics"]["judge/replies"]
    # the trained policy evaluated twice over one cache: the second asks the judge nothing, and scores the same
    cache = tmp_path / "eval_cache.sqlite"
    evals = [run([*cli, "eval", "--config", str(config), "--checkpoint", str(run_dir), f"actor_rollout_ref.model.path={tiny}",
                  f"env.llm.model_path={tiny}", *TINY_RUN,
                  f"reward.judge.cache={cache}", f"trainer.default_local_dir={tmp_path / f'eval{i}'}"]) for i in (1, 2)]
    shown = []
    for done in evals:
        assert done.returncode == 0, done.stdout[-4000:]
        shown.append(dict(re.findall(r"^(val/\S+): (\S+)", done.stdout, re.MULTILINE)))
    assert shown[0]["val/judge/cached_replies"] == "0.0000" and float(shown[0]["val/judge/replies"]) > 0
    assert shown[1]["val/judge/cached_replies"] == shown[0]["val/judge/replies"]
    assert shown[1]["val/reward/judged_right"] == shown[0]["val/reward/judged_right"]


def test_an_async_runs_generator_asks_the_judge(tmp_path):
    """Async mode: the generator's rollout connects its own judge client to the run's Env-LLM worker, and its
    judge counts come back with each unit."""
    tiny = str(cached_tiny_model("llama"))
    config = tmp_path / "judged.yaml"
    config.write_text(JUDGED.replace("min_agreement: 0.0", "min_agreement: null"))
    done = run([sys.executable, "-m", "posttrain.cli", "train", "--config", str(config), f"actor_rollout_ref.model.path={tiny}",
                f"env.llm.model_path={tiny}", *TINY_RUN, f"trainer.default_local_dir={tmp_path}", "trainer.mode=async"])
    assert done.returncode == 0, done.stdout[-4000:]
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == [1, 2]
    for record in logged:
        metrics = record["metrics"]
        assert 0 < metrics["judge/replies"] <= 8 and metrics["judge/failures"] == 0 and metrics["judge/requests"] >= 1
        assert "reward/judged_right" in metrics
