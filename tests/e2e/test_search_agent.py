"""``posttrain train --preset search_grpo`` end to end: a tiny model, vLLM on CPU, local Ray, and a
live BM25 retriever service that the trainer starts over the dataset's corpus and stops after."""

import json
import math
import os
import subprocess
import sys

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import episodes

pytestmark = [pytest.mark.slow, pytest.mark.ray]

TINY_SEARCH_RUN = [
    "data.builtin_options.train_size=8", "data.builtin_options.val_size=4", "data.builtin_options.num_people=20",
    "data.builtin_options.num_places=8", "data.builtin_options.num_organisations=6", "data.builtin_options.sft_size=0",
    "data.train_batch_size=4",
    "data.max_response_length=96", "env.max_turns=2", "env.max_turn_tokens=16", "env.max_obs_length=48",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625",
    "trainer.logger=[console,jsonl]", "trainer.test_freq=2", "trainer.total_training_steps=2",
    # a tiny random model scores about 0 on every sample, so every group ties and the update would run
    # no sample (actor.skip_zero_advantage); run them all, so the update and its metrics are exercised
    "actor_rollout_ref.actor.skip_zero_advantage=false",
]


def test_search_grpo_two_steps_with_a_live_retriever(tmp_path):
    # trainer.save_freq: the baseline below evaluates the trained checkpoint
    command = [
        sys.executable, "-m", "posttrain.cli", "train", "--preset", "search_grpo",
        f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path}",
        f"data.builtin_options.seed={os.getpid()}",  # a fresh dataset (and corpus) in the cache
        *TINY_SEARCH_RUN, "trainer.save_freq=2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "retriever (bm25) over" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    # every validation's episodes are kept beside the metrics
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["step_0.jsonl", "step_2.jsonl"]
    assert len((tmp_path / "validation" / "step_2.jsonl").read_text().splitlines()) == 4
    for step in (0, 2):  # each validation's accuracy is the fraction of its 4 episodes (4 prompts x 1) that succeeded
        rows = episodes(tmp_path / "validation" / f"step_{step}.jsonl")
        assert records[step]["metrics"]["val/synthetic_search/acc/mean@1"] == sum(r["success"] for r in rows) / 4
        assert records[step]["metrics"]["val/env/searches"] == sum(r["stats"]["searches"] for r in rows)  # the 4 episodes' count
    for record in records[1:]:
        metrics = record["metrics"]
        for name in ("num_turns/mean", "agent/valid_action_ratio", "agent/effective_action_ratio", "agent/success_rate",
                     "agent/reward_std_in_group", "actor/pg_loss", "actor/entropy", "timing_s/gen", "timing_s/update_actor"):
            assert math.isfinite(metrics[name]), name
        # a random model rarely writes a valid action: its episodes use both turns and the forced final one
        assert 1 <= metrics["num_turns/max"] <= 3
        assert 0 < metrics["response_length/mean"]
    # the service the trainer started is gone
    assert "posttrain.cli serve-retriever" not in subprocess.run(["ps", "-ef"], capture_output=True, text=True).stdout

    # the no-search baseline: the trained policy answers at once (no tool turns), one turn per episode
    baseline = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "eval", "--preset", "search_grpo", "--checkpoint", str(tmp_path),
         f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path / 'eval'}",
         f"data.builtin_options.seed={os.getpid()}", *TINY_SEARCH_RUN, "env.max_turns=0",
         "actor_rollout_ref.rollout.name=hf",  # HF generate: the training run above is the agent's vLLM run
         "--dump-episodes", str(tmp_path / "episodes.jsonl"), "--by", "hops"],
        capture_output=True, text=True, timeout=300,
    )
    assert baseline.returncode == 0, baseline.stdout[-2000:] + baseline.stderr[-2000:]
    reported = {name: text.split()[0] for name, text in (line.split(": ") for line in baseline.stdout.splitlines() if line.startswith("val/"))}
    assert float(reported["val/num_turns/max"]) == 1.0
    assert float(reported["val/env/searches"]) == 0.0
    # every held-out episode, as the chat messages `posttrain sft` reads, with a summary per number of hops
    dumped = episodes(tmp_path / "episodes.jsonl")
    assert len(dumped) == 4
    accuracy = sum(episode["success"] for episode in dumped) / 4
    assert float(reported["val/synthetic_search/acc/mean@1"]) == accuracy
    assert f"all: episodes 4.000 · accuracy {accuracy:.3f}" in baseline.stdout
    for episode in dumped:
        # with no tool turns the final-turn instruction extends the prompt as a message of its own
        assert [m["role"] for m in episode["messages"]] == ["user", "user", "assistant"]
        assert "Give your final answer now" in episode["messages"][1]["content"]
        assert episode["stats"]["num_turns"] == 1 and episode["stats"]["searches"] == 0
    assert "all: episodes 4.000" in baseline.stdout and "hops=" in baseline.stdout
