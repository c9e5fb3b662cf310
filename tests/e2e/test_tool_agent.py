"""A user's own tool, end to end: a typed function with a docstring in the user's file, importing
nothing from posttrain, described to the model and trained on with `posttrain train` (vLLM on CPU,
local Ray), run with the arguments the model wrote; the same file's tool refused by `posttrain
config` when it cannot be described. The model is the tiny one taught to call ``multiply(7, 6)``
after any prompt (a random one never writes a call)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.models import build_atomically, cached_tiny_model, models_cache_dir
from tests.e2e.cli_runs import episodes, records

pytestmark = [pytest.mark.slow, pytest.mark.ray]

USER_TOOLS = '''
import json
from typing import Literal

CALLS = CALLS_FILE


def multiply(a: int, b: int, rounding: Literal["exact", "thousands"] = "exact") -> str:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
        rounding: Whether to round the product to thousands.
    """
    with open(CALLS, "a") as calls:  # evidence for the test: each call's arguments
        calls.write(json.dumps({"a": a, "b": b, "rounding": rounding}) + "\\n")
    product = a * b
    return str(round(product, -3) if rounding == "thousands" else product)


def undescribed(a, b):
    return a * b
'''


def user_tools(calls: Path) -> str:
    """The user's tool file, its ``multiply`` appending each call's arguments to ``calls``."""
    return USER_TOOLS.replace("CALLS_FILE", repr(str(calls)))


TAUGHT_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 7, "b": 6}}\n</tool_call>'


def tool_calling_model() -> Path:
    """The tiny random model fine-tuned (once per cache) to answer any prompt that describes
    ``multiply`` with TAUGHT_CALL: a model that calls the user's tool, with arguments the test knows."""
    return build_atomically(models_cache_dir() / "tiny-llama-seed0-calls-multiply-r2", _teach_the_call)


def _teach_the_call(out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.loading import tokenize_prompts
    from posttrain.tools.schema import function_schema

    namespace: dict = {}
    exec(user_tools(Path(os.devnull)), namespace)  # the test's own tool file, described as the run describes it
    schemas = [function_schema(namespace["multiply"])]
    tokenizer = AutoTokenizer.from_pretrained(cached_tiny_model("llama"))
    model = AutoModelForCausalLM.from_pretrained(cached_tiny_model("llama"), dtype=torch.float32)
    # the built-in dataset's prompts, "What is ddd * ddd?" (and + and -), all of one length: the model
    # learns the call at those positions, which is all the run needs (it is fine-tuned in seconds)
    questions = [f"What is {100 + 137 * i} {op} {200 + 91 * i}?" for i, op in enumerate("*+-*")]
    prompts = tokenize_prompts([[{"role": "user", "content": question}] for question in questions], tokenizer, schemas)
    answer = tokenizer(TAUGHT_CALL + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + answer for prompt in prompts])  # equal lengths: the prompts differ in digits only
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        hidden = model.model(input_ids=ids).last_hidden_state[:, len(prompts[0]) - 1:-1]  # the answer's positions only
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden).flatten(0, 1), ids[:, len(prompts[0]):].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 2e-3:  # each token's probability above 0.998: sampled at temperature 1, the call comes out whole
            break
    assert loss.item() < 2e-3, f"the tiny model did not learn the call: loss {loss.item()}"
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def posttrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})


def test_a_users_own_tool_is_described_checked_and_trained_on(tmp_path):
    tools, calls = tmp_path / "my_tools.py", tmp_path / "calls.jsonl"
    tools.write_text(user_tools(calls))
    model = f"actor_rollout_ref.model.path={tool_calling_model()}"

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
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "env.max_turn_tokens=40", "data.max_response_length=128",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.logger=[console,jsonl]",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logged = records(run_dir)
    assert [r["step"] for r in logged] == [0, 1, 2]
    for record in logged[1:]:
        metrics = record["metrics"]
        # every one of the 8 episodes ended one way: an answer, a call in its final turn, or out of tokens
        ends = metrics["env/answers"] + metrics["tool/late_calls"] + metrics["agent/out_of_tokens_ratio"] * 8
        assert ends == pytest.approx(8.0)
        assert {"tool/calls", "tool/errors", "tool/success_rate"} <= metrics.keys()
        assert metrics["agent/episodes"] == 8
        assert metrics["tool/successes"] >= 1  # the taught call ran (it fails only as a late call)
    # the user's function ran, with the arguments the model wrote (rounding: its default), once for each
    # successful call the run counted: in the training steps and in the validations' episodes
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert ran and all(arguments == {"a": 7, "b": 6, "rounding": "exact"} for arguments in ran), ran
    validated = [row for step in (0, 2) for row in episodes(run_dir / "validation" / f"step_{step}.jsonl")]
    assert any('"arguments": {"a": 7, "b": 6}' in m["content"] for row in validated for m in row["messages"] if m["role"] == "assistant")
    counted = sum(r["metrics"]["tool/successes"] for r in logged[1:]) + sum(row["stats"]["tool/successes"] for row in validated)
    assert len(ran) == counted, (len(ran), counted)


REWARD = '''
def score(solution_str, ground_truth, calls):
    """1 for exactly the call multiply(7, 6), else 0: the calls are the answer."""
    return {"score": float(calls == [{"name": "multiply", "arguments": {"a": 7, "b": 6}}]), "acc": calls == [{"name": "multiply", "arguments": {"a": 7, "b": 6}}]}
'''


def test_calls_as_the_answer_are_read_from_a_single_turn_and_scored_by_the_reward_path_never_run(tmp_path):
    """``env.options.answer: calls``: `posttrain eval` runs single responses (no agent loop), each read by
    the tool format, and the user's own score function (in the reward path's child process) gets the
    calls; the tool itself never runs."""
    tools, calls, reward = tmp_path / "my_tools.py", tmp_path / "calls.jsonl", tmp_path / "reward.py"
    tools.write_text(user_tools(calls))
    reward.write_text(REWARD)
    run_dir, dumped = tmp_path / "eval", tmp_path / "episodes.jsonl"
    done = posttrain(
        "eval", "--preset", "tool_grpo", f"actor_rollout_ref.model.path={tool_calling_model()}", f"trainer.default_local_dir={run_dir}",
        f"env.tools=[{tools}:multiply]", "env.options={answer: calls}", f"custom_reward_function.path={reward}",
        "custom_reward_function.name=score", "--dump-episodes", str(dumped),
        "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.longer_size=2",
        "data.builtin_options.sft_size=0", "data.builtin_options.sft_val_size=0",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "data.max_response_length=64",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = episodes(dumped)
    assert len(rows) == 4 and all(row["success"] and row["reward"] == 1.0 for row in rows)
    assert all(row["stats"] == {"answers": 1.0, "tool/calls": 1.0, "tool/successes": 1.0} for row in rows)
    assert [m["role"] for m in rows[0]["messages"]][-1] == "assistant" and "agent/episodes" not in done.stdout
    assert not calls.exists()  # scored, never run
