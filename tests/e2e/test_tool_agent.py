"""A user's own tool, end to end: a typed function with a docstring in the user's file, importing
nothing from posttrain, described to the model and trained on with `posttrain train` (tiny model,
vLLM on CPU, local Ray); the same file's tool refused by `posttrain config` when it cannot be described."""

import json
import os
import subprocess
import sys

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records

pytestmark = [pytest.mark.slow, pytest.mark.ray]

USER_TOOLS = '''
from typing import Literal


def multiply(a: int, b: int, rounding: Literal["exact", "thousands"] = "exact") -> str:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
        rounding: Whether to round the product to thousands.
    """
    product = a * b
    return str(round(product, -3) if rounding == "thousands" else product)


def undescribed(a, b):
    return a * b
'''


def posttrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})


def test_a_users_own_tool_is_described_checked_and_trained_on(tmp_path):
    tools = tmp_path / "my_tools.py"
    tools.write_text(USER_TOOLS)
    model = f"actor_rollout_ref.model.path={cached_tiny_model('llama')}"

    shown = posttrain("tools", f"{tools}:multiply", "--model", str(cached_tiny_model("llama")))
    assert shown.returncode == 0, shown.stderr
    schemas = json.loads(shown.stdout[: shown.stdout.index("\n# the prompt")])
    assert schemas[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert schemas[0]["function"]["parameters"]["properties"]["rounding"] == {
        "type": "string", "enum": ["exact", "thousands"], "description": "Whether to round the product to thousands."}
    assert "<tools>" in shown.stdout and "Multiply two whole numbers." in shown.stdout

    refused = posttrain("config", "--preset", "tool_grpo", model, f"env.tools=[{tools}:undescribed]")
    assert refused.returncode == 2 and "parameter 'a' has no type hint" in refused.stderr

    run_dir = tmp_path / "run"
    done = posttrain(
        "train", "--preset", "tool_grpo", model, f"trainer.default_local_dir={run_dir}", f"env.tools=[{tools}:multiply]",
        "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.longer_size=2",
        "data.builtin_options.sft_size=0", "data.builtin_options.sft_val_size=0",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "env.max_turn_tokens=16", "data.max_response_length=96",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.logger=[console,jsonl]",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logged = records(run_dir)
    assert [r["step"] for r in logged] == [0, 1, 2]
    for record in logged[1:]:
        metrics = record["metrics"]
        # every episode ended one way: an answer, a call in its final turn, or out of tokens
        ends = metrics["env/answers"] + metrics["tool/late_calls"] + metrics["agent/out_of_tokens_ratio"]
        assert ends == pytest.approx(1.0)
        assert {"tool/calls", "tool/errors", "tool/success_rate"} <= metrics.keys()
        assert metrics["agent/episodes"] == 8
