"""``posttrain sft`` end to end on a tiny model: expert transcripts from the synthetic encyclopedia,
two SFT steps through the CLI (vLLM validation rollouts in the search environment, local Ray), the
export, and ``posttrain train`` starting from that export."""

import json
import math
import os
import subprocess
import sys

import pytest

from posttrain.models import cached_tiny_model



TINY_DATA = [
    "data.builtin_options.train_size=24", "data.builtin_options.val_size=4", "data.builtin_options.num_people=20",
    "data.builtin_options.num_places=8", "data.builtin_options.num_organisations=6", "data.builtin_options.sft_size=8",
    "data.builtin_options.sft_val_size=4", "data.builtin_options.sft_two_hop_fraction=0.25",
    "data.max_response_length=96", "env.max_turns=2", "env.max_turn_tokens=16", "env.max_obs_length=48",
    "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "trainer.logger=[console,jsonl]",
]


def _run(*args, timeout=600):
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.ray
def test_sft_two_steps_then_rl_from_its_export(tmp_path):
    model = cached_tiny_model("llama")
    seed = f"data.builtin_options.seed={os.getpid()}"
    out = _run("sft", "--preset", "search_sft", f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={tmp_path / 'sft'}",
               seed, *TINY_DATA, "sft.train_batch_size=4", "sft.micro_batch_size_per_gpu=2", "sft.total_training_steps=2",
               "sft.test_freq=1", "sft.optim.warmup_steps=0", "trainer.save_freq=2")
    records = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    first, last = records[0]["metrics"], records[-1]["metrics"]
    # validation before and after: the loss on held-out transcripts and the RL task's rollout
    for metrics in (first, last):
        assert math.isfinite(metrics["val/sft_loss"]) and metrics["val/sft_loss"] > 0
        assert 0 <= metrics["val/synthetic_search/acc/mean@1"] <= 1
        assert "val/env/searches" in metrics
    for record in records[1:]:
        metrics = record["metrics"]
        assert metrics["sft/tokens"] > 0 and math.isfinite(metrics["sft/loss"]) and math.isfinite(metrics["sft/grad_norm"])
    assert records[1]["metrics"]["sft/lr"] > 0
    assert "val/sft_loss:" in out and "val/synthetic_search/acc/mean@1:" in out
    export = tmp_path / "sft" / "export"
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    assert (tmp_path / "sft" / "checkpoints" / "global_step_2" / "actor").is_dir()
    assert (tmp_path / "sft" / "report" / "report.md").is_file()
    validations = sorted(p.name for p in (tmp_path / "sft" / "validation").iterdir())
    assert validations == ["step_0.jsonl", "step_2.jsonl"]

    # RL starts from the export
    _run("train", "--preset", "search_grpo", f"actor_rollout_ref.model.path={export}", f"trainer.default_local_dir={tmp_path / 'rl'}",
         seed, *TINY_DATA, "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1",
         "trainer.test_freq=-1", "trainer.val_before_train=false")
    rl = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rl] == [1] and math.isfinite(rl[0]["metrics"]["actor/pg_loss"])


@pytest.mark.parametrize("overrides, message", [
    ([], "no SFT data"),
    (["sft.train_files=[/nonexistent/sft.parquet]"], "sft.train_files = '/nonexistent/sft.parquet' (from command line): no such file"),
    (["sft.train_batch_size=6", "sft.micro_batch_size_per_gpu=4", "sft.train_files=[x.parquet]"], "sft.micro_batch_size_per_gpu"),
])
def test_sft_refuses_bad_input_before_any_worker_starts(tmp_path, overrides, message):
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", "sft", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
                           f"trainer.default_local_dir={tmp_path}", *overrides], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "metrics.jsonl").exists()
