"""DAPO's overlong reward shaping and dynamic sampling, against examples computed by hand: the
penalty per length, where it lands, which groups are kept, how many rounds it takes, and the
asynchronous buffer's extra rounds (first in line, returned on a failure, never checkpointed)."""

from __future__ import annotations

import pytest
import torch

from posttrain import keys
from posttrain.algos import overlong_penalty, rows_of_varied_groups
from posttrain.metrics import mean, total, values
from posttrain.protocol import Batch
from posttrain.rollout.groups import UpdateBatchShape, dynamic_sample, most_over_ranks
from posttrain.algos import get_advantage_estimator
from posttrain.protocol import mini_batch_count
from posttrain.trainer.learn import apply_overlong_penalty, compute_advantages


def test_the_overlong_penalty_is_zero_then_linear_to_minus_the_factor_at_the_limit():
    # max 16 tokens, a buffer of the last 4: lengths up to 12 are free, 13..16 lose 1/4 of the factor per token
    lengths = torch.tensor([0, 12, 13, 14, 16, 20])
    assert overlong_penalty(lengths, 16, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -2.0]
    assert overlong_penalty(lengths, 16, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -1.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, 16, 0, 1.0)


def test_the_penalty_lands_on_each_responses_last_loss_carrying_token():
    # responses of lengths 2 and 4 in a width of 4 (prompt width 1); buffer 2 of max 4: -0.0 and -1.0
    batch = Batch.from_dict({
        keys.RESPONSE_IDS: torch.zeros(2, 4, dtype=torch.long),
        keys.ATTENTION_MASK: torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
        keys.RESPONSE_MASK: torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
        keys.TOKEN_SCORES: torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]),
    })
    shaped, metrics = apply_overlong_penalty(batch, max_length=4, buffer=2, factor=1.0)
    assert shaped[keys.TOKEN_SCORES].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert values(metrics) == {"reward/overlong_penalty/mean": -0.5, "reward/overlong_fraction": 0.5}
    assert batch[keys.TOKEN_SCORES][1, 3] == 1.0  # the input is left as it was


def test_rows_of_groups_whose_rewards_vary():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert rows_of_varied_groups(rewards, groups).tolist() == [False, False, True, True, False, False]


def scored_round(tag: str, rewards_per_group: list[list[float]]) -> tuple[Batch, dict[str, float]]:
    """A scored rollout: one group per prompt ``<tag>:<i>``, its samples' rewards on their last token."""
    rows = [(f"{tag}:{g}", r) for g, rewards in enumerate(rewards_per_group) for r in rewards]
    scores = torch.zeros(len(rows), 3)
    scores[:, -1] = torch.tensor([r for _, r in rows])
    width = 2 if tag == "a" else 3  # rounds padded to different prompt widths are joined
    batch = Batch.from_dict({
        keys.PROMPT_IDS: torch.ones(len(rows), width, dtype=torch.long), keys.PROMPT_MASK: torch.ones(len(rows), width, dtype=torch.long),
        keys.RESPONSE_IDS: torch.ones(len(rows), 3, dtype=torch.long), keys.RESPONSE_MASK: torch.ones(len(rows), 3, dtype=torch.long),
        keys.ATTENTION_MASK: torch.ones(len(rows), width + 3, dtype=torch.long), keys.INPUT_IDS: torch.ones(len(rows), width + 3, dtype=torch.long),
        keys.POSITION_IDS: torch.arange(width + 3).expand(len(rows), -1).clone(), keys.TOKEN_SCORES: scores,
    }, {keys.UID: [uid for uid, _ in rows]}, {keys.WEIGHT_VERSION: 7})
    return batch, {"reward/samples": total(len(rows)), "critic/score/mean": mean(float(scores.sum() / len(rows)), len(rows))}


def test_dynamic_sampling_generates_rounds_until_enough_groups_vary():
    # 4 groups wanted. Round a: groups 1 and 3 vary; round b: groups 0, 2 and 3 vary -> a:1 a:3 b:0 b:2
    first = scored_round("a", [[1, 1], [0, 1], [0, 0], [1, 0]])
    rounds = iter([scored_round("b", [[0, 1], [1, 1], [1, 0], [0, 1]]), scored_round("c", [[0, 1]] * 4)])
    batch, metrics = dynamic_sample(first, lambda: next(rounds), 4, 10, UpdateBatchShape(4, 2, 1), pad_token_id=0)
    assert list(dict.fromkeys(batch[keys.UID])) == ["a:1", "a:3", "b:0", "b:2"]
    assert batch[keys.GROUP_IDS].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch[keys.PROMPT_IDS].shape[1] == 3 and batch[keys.PROMPT_MASK][0].tolist() == [0, 1, 1]  # left-padded to the widest
    assert metrics["dynamic_sampling/rounds"].value == 2 and metrics["dynamic_sampling/dropped_groups"].value == 3
    assert metrics["dynamic_sampling/kept_groups"].value == 4 and metrics["reward/samples"].value == 16  # both rounds' samples counted
    assert batch.meta[keys.WEIGHT_VERSION] == 7
    assert next(rounds)[0][keys.UID][0] == "c:0"  # round c was never asked for


def test_past_the_round_limit_or_the_data_the_step_trains_what_it_kept_in_whole_mini_batches():
    first = scored_round("a", [[1, 1], [0, 1], [0, 0], [1, 0]])  # 2 groups vary
    more = lambda: scored_round("b", [[1, 1], [0, 1], [1, 1], [1, 1]])  # noqa: E731  1 more
    batch, metrics = dynamic_sample(first, more, 4, 2, UpdateBatchShape(2, 2, 1), pad_token_id=0)
    assert list(dict.fromkeys(batch[keys.UID])) == ["a:1", "a:3"]  # 3 kept, trimmed to a mini-batch of 2
    assert metrics["dynamic_sampling/rounds"].value == 2 and metrics["dynamic_sampling/kept_groups"].value == 2
    batch, metrics = dynamic_sample(first, lambda: None, 4, 10, UpdateBatchShape(2, 2, 1), pad_token_id=0)  # the data ran out
    assert metrics["dynamic_sampling/rounds"].value == 1 and len(set(batch[keys.UID])) == 2
    flat = scored_round("a", [[1, 1], [0, 0]])
    batch, metrics = dynamic_sample(flat, lambda: None, 2, 10, UpdateBatchShape(2, 2, 1), pad_token_id=0)
    assert batch is flat[0] and metrics["dynamic_sampling/kept_groups"].value == 0  # nothing varies: the first round, teaching nothing


def test_kl_groups_keep_the_best_scored_dropped_groups_after_the_batch_marked_for_the_kl_loss_alone():
    # a: groups 1, 3 vary, 0 (all 1) and 2 (all 0) do not; b: 0, 2 vary, 1 (all 1) and 3 (all 0.5) do not
    first = scored_round("a", [[1, 1], [0, 1], [0, 0], [1, 0]])
    again = lambda: scored_round("b", [[0, 1], [1, 1], [1, 0], [0.5, 0.5]])  # noqa: E731
    batch, metrics = dynamic_sample(first, again, 4, 10, UpdateBatchShape(4, 2, 1), pad_token_id=0, kl_groups=3)
    # the four that vary, then the best-scored dropped ones: a:0 and b:1 (1, a:0 earlier), b:3 (0.5) before a:2 (0)
    assert list(dict.fromkeys(batch[keys.UID])) == ["a:1", "a:3", "b:0", "b:2", "a:0", "b:1", "b:3"]
    assert batch[keys.GROUP_IDS].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    assert batch[keys.KL_ONLY].tolist() == [False] * 8 + [True] * 6
    assert batch.meta[keys.GROUP_COUNT] == 7 and batch.meta[keys.KL_GROUP_COUNT] == 3 and batch.meta[keys.WEIGHT_VERSION] == 7
    assert mini_batch_count(batch, 2) == 2  # the optimizer steps of the 4 kept groups (in 2s): the other 3 ride in them
    assert metrics["dynamic_sampling/kept_groups"].value == 4 and metrics["dynamic_sampling/kl_groups"].value == 3
    assert batch[keys.TOKEN_SCORES].sum(-1)[8:].tolist() == [1, 1, 1, 1, 0.5, 0.5]
    # among equals the earlier round's stays, however many were cut before it: a:2 (after two lower ones), not b:0
    low_first = scored_round("a", [[0, 0], [0, 0], [1, 1], [0, 1]])
    batch, _ = dynamic_sample(low_first, lambda: scored_round("b", [[1, 1], [1, 0]]), 2, 10, UpdateBatchShape(2, 2, 1), pad_token_id=0,
                              kl_groups=1)
    assert list(dict.fromkeys(batch[keys.UID])) == ["a:3", "b:1", "a:2"]
    # 4 ranks: 7 groups of 2 samples do not divide, 6 do
    batch, metrics = dynamic_sample(first, again, 4, 10, UpdateBatchShape(4, 2, 4), pad_token_id=0, kl_groups=3)
    assert list(dict.fromkeys(batch[keys.UID]))[4:] == ["a:0", "b:1"] and metrics["dynamic_sampling/kl_groups"].value == 2
    assert most_over_ranks(3, 1, UpdateBatchShape(4, 2, 4)) == 3 and most_over_ranks(3, 2, UpdateBatchShape(4, 2, 4)) == 2  # counts the groups before
    # none asked for: the batch as before, no group count of its own
    batch, metrics = dynamic_sample(first, again, 4, 10, UpdateBatchShape(4, 2, 1), pad_token_id=0)
    assert len(set(batch[keys.UID])) == 4 and keys.GROUP_COUNT not in batch.meta and "dynamic_sampling/kl_groups" not in metrics
    assert keys.KL_ONLY not in batch
    # nothing varies: the first round as it was, and the metric still there
    flat = scored_round("a", [[1, 1], [0, 0]])
    batch, metrics = dynamic_sample(flat, lambda: None, 2, 10, UpdateBatchShape(2, 2, 1), pad_token_id=0, kl_groups=1)
    assert batch is flat[0] and metrics["dynamic_sampling/kl_groups"].value == 0


def test_groups_kept_for_the_kl_loss_get_advantage_0_even_where_the_overlong_penalty_made_them_differ():
    first = scored_round("a", [[1, 1], [0, 1]])  # a:0 is flat, kept for the KL loss
    batch, _ = dynamic_sample(first, lambda: None, 1, 1, UpdateBatchShape(1, 2, 1), pad_token_id=0, kl_groups=1)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]])  # a:1 (kept), then a:0 (the KL's alone)
    batch.tensors[keys.RESPONSE_MASK], batch.tensors[keys.ATTENTION_MASK][:, 2:] = mask, mask
    shaped, _ = apply_overlong_penalty(batch, 3, 2, 1.0)
    advantages = compute_advantages(shaped, get_advantage_estimator("grpo"))[keys.ADVANTAGES]
    assert advantages[2:].abs().sum() == 0  # a:0's two answers scored 1 each, then lengths 3 and 2 moved them apart
    assert advantages[:2].abs().sum() > 0
    shaped.tensors.pop(keys.KL_ONLY)
    assert compute_advantages(shaped, get_advantage_estimator("grpo"))[keys.ADVANTAGES][2:].abs().sum() > 0  # the marks did it
