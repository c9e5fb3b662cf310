"""``env.name: program`` through the real CLI (HF generate, local Ray): a user's plain ``openai``
program trained in async mode, its generators serving the endpoint, with episodes that break their
prefix (more samples than episodes) split into two mini-batches, validated; a bad entry refused by the
config check before any worker. (The command form, and the rollout's rows and scores, are tested in
process: tests/rollout/test_program_rollout.py.)"""

import os
import subprocess
import sys

import pytest
from tests.optional import require

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import episodes, records
from tests.e2e.test_train_cli import HF_ROLLOUT

pytestmark = [pytest.mark.slow, pytest.mark.ray]

require("openai", 'the openai SDK is installed by scripts/setup.sh (pip install -e ".[dev]")')

PROGRAM = '''
import os


async def rollout(client, row):
    """Odd rows ask twice, the second time with other history (a prefix break). Of a row's two episodes
    the first to claim the row scores 1, the other 0, so every group has something to learn."""
    await client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=8)
    if row["extra_info"]["index"] % 2:
        await client.chat.completions.create(model="policy", messages=row["messages"] + [{"role": "user", "content": "Again."}], max_tokens=8)
    claim = os.path.join(CLAIMS, f"{row['extra_info']['split']}-{row['extra_info']['index']}")
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL))
        return 1.0
    except FileExistsError:
        return 0.0
'''

RUN = ["--preset", "tool_grpo", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", "env.name=program", "env.tools=[]",
       "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.longer_size=2",
       "data.builtin_options.sft_size=0", "data.builtin_options.sft_val_size=0", "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625",
       "data.max_response_length=64", "trainer.logger=[console,jsonl]", HF_ROLLOUT]  # the point is the program, not the engine


def posttrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})


def test_a_program_trains_in_async_mode_with_prefix_breaks_and_a_bad_entry_is_refused(tmp_path):
    program = tmp_path / "agent.py"
    (tmp_path / "claims").mkdir()
    program.write_text(PROGRAM.replace("CLAIMS", repr(str(tmp_path / "claims"))))

    refused = posttrain("config", *RUN, f"env.options={{entry: {program}:run_agent}}")
    assert refused.returncode == 2 and "has no function 'run_agent' (its functions: ['rollout'])" in refused.stderr

    run_dir = tmp_path / "run"
    done = posttrain("train", *RUN, f"env.options={{entry: {program}:rollout}}", f"trainer.default_local_dir={run_dir}",
                     "trainer.mode=async", "async.max_staleness=1", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                     "trainer.total_training_steps=2", "trainer.test_freq=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = [r["metrics"] for r in records(run_dir) if r["step"] > 0]
    assert len(trained) == 2
    for metrics in trained:
        # 8 episodes a step, those of odd rows two samples each: more rows than episodes, trained in 2 mini-batches
        breaks = metrics["program/prefix_breaks"]
        assert metrics["program/samples_per_episode"] == 1 + breaks and metrics["program/requests"] == 8 * (1 + breaks)
        assert metrics["program/errors"] == 0 and metrics["actor/grad_norm"] > 0 and "async/staleness/max" in metrics
    assert any(metrics["program/prefix_breaks"] > 0 for metrics in trained)
    validated = episodes(run_dir / "validation" / "step_2.jsonl")
    assert len(validated) == 4 and [row["stats"]["samples"] for row in validated] == [1.0, 2.0, 1.0, 2.0]
    assert all(row["messages"][-2]["content"] == "Again." for row in validated[1::2])  # the last sample's conversation

