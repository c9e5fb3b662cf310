"""A one-turn task whose answer is its calls (``env.options.answer: calls``, BFCL's single-turn rows) is
a single-turn rollout: each response read by the run's tool format, its calls checked and handed to the
one reward path (the reward manager: deadlines, counts) as the answer, never run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from posttrain import keys
from posttrain.cli.preflight import load_run_config
from posttrain.config import ConfigError
from posttrain.config.schema import PosttrainConfig
from posttrain.data.dataset import RLDataset
from posttrain.errors import InputError
from posttrain.metrics import total
from posttrain.protocol import Batch
from posttrain.rewards.manager import RewardManager
from posttrain.rollout import AgentRollout, SingleTurnRollout, build_rollout
from posttrain.rollout.calls import CallsAnswers
from posttrain.rollout.roles import RolloutRoles

STOCKS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}}}
    for name in ("get_stock_price", "get_dividend")]
TRUTH = [{"name": "get_stock_price", "arguments": {"ticker": "ACME"}}, {"name": "get_dividend", "arguments": {"ticker": "ACME"}}]
SEEN: list = []
NO_MODEL = RolloutRoles(actor=None)  # scoring only: no sampler, no reward model


def probe_score(solution_str, ground_truth, extra_info, calls):
    """The calls against the ground truth, noting each call it is asked (inline scoring, so SEEN is this process's)."""
    SEEN.append(calls)
    right = calls == json.loads(ground_truth)
    return {"score": float(right), "acc": right}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def config_with(**env) -> PosttrainConfig:
    config = PosttrainConfig()
    config.env.name, config.env.options = "tools", {"answer": "calls"}
    for key, value in env.items():
        setattr(config.env, key, value)
    return config


def responses(tokenizer, texts: list[str], truths: list[str], tools: list[list[dict]]) -> Batch:
    """A batch of single-turn responses as SingleTurnRollout scores them (each text then eos)."""
    ids = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in texts]
    width = max(map(len, ids))
    response = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, tokens in enumerate(ids):
        response[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    return Batch.from_dict({keys.RESPONSE_IDS: response, keys.RESPONSE_MASK: mask}, {
        keys.GROUND_TRUTH: np.array(truths, dtype=object), keys.DATA_SOURCE: np.array(["probe"] * len(ids), dtype=object),
        keys.EXTRA_INFO: np.array([{"tools": json.dumps(t)} for t in tools], dtype=object)})


@pytest.fixture
def rollout(tokenizer):
    made = SingleTurnRollout(RewardManager(tokenizer, score_functions={"probe": probe_score}, timeout_s=None), 64,
                             tokenizer.pad_token_id, CallsAnswers(config_with().env, tokenizer))
    made.open(roles=None)
    yield made
    made.close()


def test_the_calls_are_the_answer_scored_by_the_reward_path_and_never_run(tokenizer, rollout):
    SEEN.clear()
    texts = [call("get_stock_price", ticker="ACME") + "\n" + call("get_dividend", ticker="ACME"),
             call("get_weather", city="Paris"),                      # not this row's tool: judged and counted, not run
             "None of these functions can help with that.",          # an irrelevance row's right answer: no call
             '<tool_call>\n{"name": "get_dividend", "arguments": {"ticker": \n</tool_call>']  # unreadable
    truths = [json.dumps(TRUTH), json.dumps(TRUTH), "[]", json.dumps(TRUTH)]
    scored, metrics = rollout.score(NO_MODEL, responses(tokenizer, texts, truths, [STOCKS, STOCKS, STOCKS, STOCKS]))
    assert scored[keys.TOKEN_SCORES].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert SEEN == [TRUTH, [{"name": "get_weather", "arguments": {"city": "Paris"}}], []]  # the unreadable one is not asked
    assert [count["tool/calls"] for count in rollout._counts] == [2, 1, 0, 1]
    assert rollout._counts[1]["tool/errors/unknown_tool"] == 1 and rollout._counts[3]["tool/errors/bad_json"] == 1
    assert metrics["tool/calls"] == total(4) and metrics["tool/errors"] == total(2)  # the step's counts, logged once
    assert metrics["env/answers"] == total(4) and metrics["tool/success_rate"].value == pytest.approx(2 / 4)
    assert metrics["reward/samples"].value == 3 and metrics["reward/errors"].value == 0  # the unreadable one is not scored
    assert scored["reward_extra/acc"][:3].tolist() == [1.0, 0.0, 1.0] and np.isnan(scored["reward_extra/acc"][3])


def test_a_score_function_that_fails_is_counted_for_the_breaker_as_on_every_other_answer(tokenizer):
    def broken(solution_str, ground_truth, calls):
        raise ZeroDivisionError("no")

    made = SingleTurnRollout(RewardManager(tokenizer, score_functions={"probe": broken}, timeout_s=None), 64,
                             tokenizer.pad_token_id, CallsAnswers(config_with().env, tokenizer))
    made.open(roles=None)
    try:
        scored, metrics = made.score(NO_MODEL, responses(tokenizer, [call("get_dividend", ticker="X")], [json.dumps(TRUTH)], [STOCKS]))
    finally:
        made.close()
    assert metrics["reward/errors"].value == 1 and "ZeroDivisionError" in made.first_failures["reward"]
    assert scored[keys.TOKEN_SCORES].sum().item() == 0.0


def test_build_rollout_runs_calls_as_the_answer_single_turn_and_every_other_tool_task_as_episodes(tokenizer):
    assert isinstance(build_rollout(config_with(), tokenizer, None), SingleTurnRollout)
    text = config_with(tools=["posttrain.tools:calculator"])
    text.env.options = {}
    assert isinstance(build_rollout(text, tokenizer, None), AgentRollout)


def test_every_row_the_calls_cannot_answer_is_refused_before_any_worker_starts(tmp_path, tokenizer):
    def row(question, tools, index, source="arithmetic"):
        return {"data_source": source, "prompt": [{"role": "user", "content": question}], "reward_model": {"style": "rule", "ground_truth": "[]"},
                "extra_info": {"index": index, "tools": json.dumps(tools) if tools is not None else None}}

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row("Stocks?", STOCKS, 0), row("Anything?", [], 1), row("2+2?", None, 2)]), path)
    with pytest.raises(InputError, match=r"^validation prompt 2: env.name=tools needs tools"):
        build_rollout(config_with(), tokenizer, tmp_path).check_data(training=None, validation=RLDataset([path], tokenizer, max_prompt_length=4096))
    build_rollout(config_with(tools=["posttrain.tools:calculator"]), tokenizer, tmp_path).check_data(
        validation=RLDataset([path], tokenizer, max_prompt_length=4096))  # the run's own tool: every row has one
    pq.write_table(pa.Table.from_pylist([row("Stocks?", STOCKS, 0, source="probe")]), path)
    with pytest.raises(ValueError, match=r"rows.parquet row 0, data_source: 'probe' has no score function"):
        build_rollout(config_with(), tokenizer, tmp_path).check_data(training=RLDataset([path], tokenizer, max_prompt_length=4096))


def test_episode_batch_settings_are_refused_where_the_calls_are_the_answer():
    base = ["env.name=tools", "env.tools=[posttrain.tools:calculator]", "env.options={answer: calls}"]
    with pytest.raises(ConfigError) as error:
        load_run_config([], [*base, "env.reward_norm=group", "env.filter_groups_quantile=0.5"])
    assert "env.filter_groups_quantile = 0.5" in str(error.value)
    assert "env.reward_norm" not in str(error.value)  # single-turn rows normalise their rewards too
    load_run_config([], [*base, "env.reward_norm=batch"])  # and nothing else is refused


def test_an_answer_that_could_not_be_scored_is_not_a_success_in_the_validation(tokenizer, rollout):
    """Its acc is NaN (the score function never said): accuracy falls back to its score, 0."""
    from posttrain.trainer.validation import sample_accuracy

    unreadable = '<tool_call>\n{"name": "get_dividend", "arguments": {"ticker": \n</tool_call>'
    scored, _ = rollout.score(NO_MODEL, responses(tokenizer, [call("get_dividend", ticker="ACME"), unreadable],
                                                  [json.dumps(TRUTH[1:]), json.dumps(TRUTH)], [STOCKS, STOCKS]))
    assert sample_accuracy(scored).tolist() == [1.0, 0.0]
