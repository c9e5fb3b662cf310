"""The Learner's phases with stand-in workers: what the actor's update is given is what the
advantage phase made of the scores, overlong shaping included (DAPO)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.metrics import Kind, mean
from posttrain.protocol import Batch
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakers
from posttrain.trainer.learn import Learner
from posttrain.trainer.roles import Roles


class StandInActor:
    """Records the batches its update is given; the old-logprob pass returns zeros."""

    def __init__(self) -> None:
        self.updated: list[Batch] = []

    def compute_log_prob(self, batch: Batch) -> Batch:
        zeros = torch.zeros(batch[keys.RESPONSE_MASK].shape)
        return Batch.from_dict({keys.OLD_LOGPROBS: zeros, keys.ENTROPY: zeros})

    def update(self, batch: Batch) -> SimpleNamespace:
        self.updated.append(batch)
        return SimpleNamespace(metrics={"actor/pg_loss": [mean(0.0)]})


def test_the_update_trains_on_the_overlong_shaped_scores():
    # two groups of two; max 4 tokens, the last 2 a buffer with factor 1: length 4 loses 1.0, length 2 nothing.
    # Group 0 scores 1 and 1 (a tie, so 0 advantage unshaped); its second response, 4 tokens long,
    # ends at 1 − 1 = 0, so with the group mean 0.5 the advantages are +0.5 and −0.5 on every token.
    # Group 1: both 4 tokens, scores 1 and 0, shaped 0 and −1: advantages +0.5 and −0.5, as unshaped.
    config = PosttrainConfig()
    config.algorithm.adv_estimator, config.algorithm.norm_adv_by_std_in_grpo = "grpo", False
    config.data.max_response_length = 4
    overlong = config.reward_model.overlong_buffer
    overlong.enable, overlong.len, overlong.penalty_factor = True, 2, 1.0
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    scores = torch.zeros(4, 4)
    scores[0, 1], scores[1, 3], scores[2, 3] = 1.0, 1.0, 1.0
    batch = Batch.from_dict({
        keys.RESPONSE_IDS: torch.ones(4, 4, dtype=torch.long), keys.RESPONSE_MASK: response_mask,
        keys.ATTENTION_MASK: torch.cat([torch.ones(4, 1, dtype=torch.long), response_mask], dim=1),
        keys.TOKEN_SCORES: scores, keys.GROUP_IDS: torch.tensor([0, 0, 1, 1]),
    })
    actor = StandInActor()
    roles = Roles(actor=actor, ref=None, critic=None, reward_model=None, pools=None)

    learned, metrics = Learner(config, CircuitBreakers(BreakerLimits()))(roles, batch, step=1, timings={})

    (trained,) = actor.updated
    expected = torch.tensor([0.5, -0.5, 0.5, -0.5])[:, None] * response_mask
    assert torch.allclose(trained[keys.ADVANTAGES], expected)
    assert trained[keys.TOKEN_SCORES][1].tolist() == [0.0, 0.0, 0.0, 0.0]  # 1 − 1 on its last token
    assert torch.equal(learned[keys.ADVANTAGES], trained[keys.ADVANTAGES])
    assert metrics["reward/overlong_penalty/mean"].value == -0.75 and metrics["reward/overlong_fraction"].value == 0.75


def test_the_rollout_logprob_gap_is_how_far_the_trainers_old_logprobs_are_from_the_samplers():
    # Two updates a step (a mini-batch of half the batch): the old-logprob pass runs and returns zeros. The rollout's
    # behaviour logprobs differ from them by 0.1 and 0.3 on the loss tokens; the masked-out positions (0.9) count for
    # nothing. Mean |π_old − μ| = (0.1 + 0.1 + 0.3) / 3, max 0.3.
    config = PosttrainConfig()
    config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size = 2, 1
    response_mask = torch.tensor([[1, 1], [1, 0]])
    batch = Batch.from_dict({
        keys.RESPONSE_IDS: torch.ones(2, 2, dtype=torch.long), keys.RESPONSE_MASK: response_mask,
        keys.ATTENTION_MASK: torch.cat([torch.ones(2, 1, dtype=torch.long), response_mask], dim=1),
        keys.TOKEN_SCORES: torch.tensor([[0.0, 1.0], [0.0, 0.0]]), keys.GROUP_IDS: torch.tensor([0, 0]),
        keys.BEHAVIOUR_LOGPROBS: torch.tensor([[-0.1, 0.1], [-0.3, -0.9]]),
    })
    roles = Roles(actor=StandInActor(), ref=None, critic=None, reward_model=None, pools=None)

    _, metrics = Learner(config, CircuitBreakers(BreakerLimits()))(roles, batch, step=1, timings={})

    assert abs(metrics["rollout/logprob_gap"].value - 0.5 / 3) < 1e-6 and metrics["rollout/logprob_gap"].count == 3
    assert abs(metrics["rollout/logprob_gap/max"].value - 0.3) < 1e-6 and metrics["rollout/logprob_gap/max"].kind is Kind.MAX
    del batch.tensors[keys.BEHAVIOUR_LOGPROBS]  # a batch without the rollout's logprobs: no gap to report
    _, metrics = Learner(config, CircuitBreakers(BreakerLimits()))(roles, batch, step=1, timings={})
    assert "rollout/logprob_gap" not in metrics
