"""A mixture of three environments through the real CLI (tiny model, Hugging Face generate, local Ray):
arithmetic and a reasoning-gym task (single-turn, each scored by its own function) and a TextArena game (an
agent whose rewards the library gives), in one run, sync and async. Each step's batch holds the sources as their
weights allocate it, each source's rows are played by its own environment within its own budget, and each
source is validated on its own (val/<name>/...)."""

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e import cli_runs
from tests.e2e.test_train_cli import HF_ROLLOUT, run_train

pytestmark = [pytest.mark.slow, pytest.mark.ray]

KWARGS = "{max_number: 10, max_turns: 3}"
MIXTURE = (
    "mixture=[{name: arith, weight: 2, data: {builtin: arithmetic, builtin_options: {train_size: 8, val_size: 4}, max_response_length: 8}}, "
    "{name: rg, weight: 1, data: {builtin: reasoning-gym, builtin_options: {tasks: chain_sum, size: 8, test_size: 4}}}, "
    f"{{name: guess, weight: 1, data: {{builtin: textarena, builtin_options: {{id: GuessTheNumber-v0, kwargs: {KWARGS}, size: 8, test_size: 4}}}}, "
    f"env: {{name: textarena, options: {{id: GuessTheNumber-v0, kwargs: {KWARGS}}}, max_turns: 3}}}}]"
)
# run_train's TINY_RUN sets the top's data.builtin_options (a single dataset's); a mixture's sources set their own
RUN = ["--preset=", MIXTURE, "data.builtin_options={}", "data.max_response_length=64", "data.max_prompt_length=192",
       "env.max_turn_tokens=8", "env.max_obs_length=64", "trainer.rollout_data_dir=rollouts", HF_ROLLOUT]


def step_rows(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def check_run(run_dir: Path, steps: int) -> None:
    records = cli_runs.records(run_dir)
    for step in range(1, steps + 1):
        rows = step_rows(run_dir, step)
        # 4 prompts a step by weights 2:1:1, 2 samples each
        assert Counter(row["source"] for row in rows) == {"arith": 4, "rg": 2, "guess": 2}
        for row in rows:
            source, roles = row["source"], [message["role"] for message in row["messages"]]
            if source == "guess":  # the game's own opening, then moves and the game's replies
                assert row["data_source"] == "textarena" and row["stats"]["num_turns"] >= 1 and "assistant" in roles
            else:  # one answer, within the source's own budget (arith: 8 tokens; rg: the run's 64)
                assert roles.count("assistant") == 1 and roles[-1] == "assistant" and row["stats"] == {}
                assert row["response_tokens"] <= (8 if source == "arith" else 64)
        metrics = next(r["metrics"] for r in records if r["step"] == step)
        assert {name: metrics[f"mixture/{name}/samples"] for name in ("arith", "rg", "guess")} == {"arith": 4, "rg": 2, "guess": 2}
        assert "env/invalid_moves" in metrics  # the game's own counters, beside the single-turn sources' rows
    assert max(row["response_tokens"] for step in range(1, steps + 1) for row in step_rows(run_dir, step) if row["source"] == "arith") <= 8
    validated = next(r["metrics"] for r in records if r["step"] == steps)
    assert {name for name in ("arith", "rg", "guess") if f"val/{name}/acc/mean@1" in validated} == {"arith", "rg", "guess"}
    episodes = cli_runs.episodes(run_dir / "validation" / f"step_{steps}.jsonl")
    assert Counter(row["source"] for row in episodes) == {"arith": 4, "rg": 4, "guess": 4}


def test_a_mixture_of_three_environments_trains_with_each_batch_allocated_by_weight(tmp_path):
    run_train(tmp_path, *RUN, "trainer.total_training_steps=2", "trainer.test_freq=2")
    check_run(tmp_path, 2)


def test_an_async_mixture_allocates_and_joins_units_of_single_sources(tmp_path):
    # units of one group: most hold one source only, so the trainer's join meets pieces without an episode's columns
    run_train(tmp_path, *RUN, "trainer.mode=async", "async.unit_groups=1", "trainer.total_training_steps=2", "trainer.test_freq=2")
    check_run(tmp_path, 2)
