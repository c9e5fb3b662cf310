"""Properties that tie the pieces together (DESIGN.md, testing tier 4)."""

import pytest
import torch

from posttrain.algos import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    drgrpo_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    logprobs_from_logits,
    loss_normalizer,
    rloo_advantages,
    value_loss,
)

from .helpers import random_mask

LOSS_NAMES = ["ppo", "gspo", "cispo"]


def _split(batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(batch, generator=gen)
    cuts = sorted(int(c) + 1 for c in torch.randperm(batch - 1, generator=gen)[:3])
    return list(torch.tensor_split(order, cuts))


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_loss_micro_batches_sum_to_the_full_batch(name, mode, gen):
    # Four micro-batches (as on 2 ranks x 2 accumulation steps) with the global normaliser give the
    # full batch's loss and gradient, in any order.
    batch, length = 10, 7
    logprobs = (-torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    old = logprobs.detach() + torch.randn(batch, length, generator=gen, dtype=torch.float64) * 0.3
    advantages = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    mask = random_mask(batch, length, gen)
    loss_fn = POLICY_LOSSES[name]
    options = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "loss_agg_mode": mode}
    full = loss_fn(logprobs, old, advantages, mask, **options).loss
    pieces = _split(batch, gen)
    normalizer = sum(loss_normalizer(mask[p], mode) for p in pieces)
    total = sum(loss_fn(logprobs[p], old[p], advantages[p], mask[p], global_normalizer=normalizer, **options).loss
                for p in pieces)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(torch.autograd.grad(total, logprobs)[0], torch.autograd.grad(full, logprobs)[0])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_micro_batches_sum_to_the_full_batch(mode, gen):
    values = torch.randn(8, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    old = values.detach() + torch.randn(8, 5, generator=gen, dtype=torch.float64) * 0.5
    returns = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    mask = random_mask(8, 5, gen)
    full = value_loss(values, old, returns, mask, loss_agg_mode=mode).loss
    pieces = _split(8, gen)
    normalizer = sum(loss_normalizer(mask[p], mode) for p in pieces)
    total = sum(value_loss(values[p], old[p], returns[p], mask[p], loss_agg_mode=mode,
                           global_normalizer=normalizer).loss for p in pieces)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(torch.autograd.grad(total, values)[0], torch.autograd.grad(full, values)[0])


@pytest.mark.parametrize("estimator", [grpo_advantages, drgrpo_advantages, rloo_advantages, grpo_passk_advantages])
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_group_of_equal_rewards_gives_zero_advantage_and_zero_gradient(estimator, name, gen):
    # Group 0 (rows 0-3) all scored 0.7; group 1 (rows 4-7) scored differently. Off-policy logprobs,
    # so that every loss is away from its ratio-1 point.
    scores = torch.tensor([0.7, 0.7, 0.7, 0.7, 0.1, 0.9, 0.4, 0.3])
    group_ids = torch.tensor([3, 3, 3, 3, 8, 8, 8, 8])
    mask = random_mask(8, 6, gen, holes=False)
    mask[-1, :2] = 1.0  # the helper empties the last row; group 1 needs it to differ
    advantages = estimator(scores, mask, group_ids).advantages
    assert advantages[:4].abs().max().item() == 0.0
    logprobs = (-torch.rand(8, 6, generator=gen) * 2).requires_grad_()
    old = logprobs.detach() + torch.randn(8, 6, generator=gen) * 0.3
    loss = POLICY_LOSSES[name](logprobs, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2).loss
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad[:4].abs().max().item() == 0.0
    assert grad[4:].abs().max().item() > 0.0  # the other group does learn


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_on_policy_gradient_equals_reinforce(name, mode, gen):
    # At ratio 1 (logprobs == old) nothing is clipped, and each loss's gradient with respect to the
    # logits is the REINFORCE gradient of -A * log pi, aggregated the same way.
    logits = torch.randn(5, 6, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (5, 6), generator=gen)
    advantages = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    mask = random_mask(5, 6, gen)
    logprobs = logprobs_from_logits(logits, labels)
    loss = POLICY_LOSSES[name](logprobs, logprobs.detach(), advantages, mask, loss_agg_mode=mode).loss
    reinforce = aggregate_loss(-advantages * logprobs, mask, mode)
    (loss_grad,) = torch.autograd.grad(loss, logits, retain_graph=True)  # both losses share logprobs
    torch.testing.assert_close(loss_grad, torch.autograd.grad(reinforce, logits)[0])
