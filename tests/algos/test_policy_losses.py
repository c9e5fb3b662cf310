import math

import pytest
import torch

from posttrain.algos import cispo_policy_loss, gspo_policy_loss, ppo_policy_loss

from .helpers import SHAPES, random_mask, rows


def _inputs(shape, gen, spread=0.5):
    logprobs = (-torch.rand(shape, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logprobs.detach() + torch.randn(shape, generator=gen, dtype=torch.float64) * spread
    advantages = torch.randn(shape, generator=gen, dtype=torch.float64)
    return logprobs, old, advantages, random_mask(*shape, gen)


def _k3(log_ratio: float) -> float:
    return math.exp(log_ratio) - 1 - log_ratio


def _loop_ppo(logprobs, old, advantages, mask, low, high, dual):
    """Token-mean PPO loss built one token at a time from scalar tensors (autograd follows)."""
    total, clipped, dual_count, k1, k3, positions = 0.0, 0, 0, 0.0, 0.0, 0
    for b, valid in enumerate(rows(mask)):
        for t in valid:
            a = advantages[b, t].item()
            ratio = torch.exp(logprobs[b, t] - old[b, t])
            unclipped, clip = -a * ratio, -a * torch.clamp(ratio, 1 - low, 1 + high)
            term = torch.maximum(unclipped, clip)
            clipped += int(clip.item() > unclipped.item())
            if dual is not None and a < 0 and term.item() > -a * dual:
                term, dual_count = term * 0 + (-a * dual), dual_count + 1
            total = total + term
            k1 += (old[b, t] - logprobs[b, t]).item()
            k3 += _k3((logprobs[b, t] - old[b, t]).item())
            positions += 1
    return total / positions, clipped / positions, dual_count / positions, k1 / positions, k3 / positions


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("low,high,dual", [(0.2, 0.2, 3.0), (0.2, 0.28, 1.5), (0.1, 0.3, None)])
def test_ppo_matches_loop(shape, low, high, dual, gen):
    logprobs, old, advantages, mask = _inputs(shape, gen)
    out = ppo_policy_loss(logprobs, old, advantages, mask, clip_ratio_low=low, clip_ratio_high=high,
                          clip_ratio_dual=dual)
    loss, clipfrac, lower, k1, k3 = _loop_ppo(logprobs, old, advantages, mask, low, high, dual)
    torch.testing.assert_close(out.loss, loss)
    assert (out.clipfrac.item(), out.clipfrac_lower.item()) == pytest.approx((clipfrac, lower))
    assert (out.ppo_kl.item(), out.ppo_kl_k3.item()) == pytest.approx((k1, k3))
    torch.testing.assert_close(torch.autograd.grad(out.loss, logprobs)[0], torch.autograd.grad(loss, logprobs)[0])


def _loop_gspo_sequence_level(logprobs, old, advantages, mask, low, high):
    """GSPO as the paper's sequence objective: s_i = exp(mean_t log r_it), one advantage per sequence."""
    total, count = 0.0, 0
    for b, valid in enumerate(rows(mask)):
        if not valid:
            continue
        s = torch.exp(sum(logprobs[b, t] - old[b, t] for t in valid) / len(valid))
        a = advantages[b, valid[0]].item()
        total = total + torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
        count += 1
    return total / count


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("low,high", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_form_equals_sequence_objective(shape, low, high, gen):
    logprobs, old, _, mask = _inputs(shape, gen, spread=0.1)
    advantages = torch.randn(shape[0], 1, generator=gen, dtype=torch.float64).expand(shape)
    out = gspo_policy_loss(logprobs, old, advantages, mask, clip_ratio_low=low, clip_ratio_high=high)
    reference = _loop_gspo_sequence_level(logprobs, old, advantages, mask, low, high)
    torch.testing.assert_close(out.loss, reference)
    torch.testing.assert_close(torch.autograd.grad(out.loss, logprobs)[0],
                               torch.autograd.grad(reference, logprobs)[0])


def _loop_cispo(logprobs, old, advantages, mask, low, high):
    total, above, below, positions = 0.0, 0, 0, 0
    for b, valid in enumerate(rows(mask)):
        for t in valid:
            ratio = math.exp((logprobs[b, t] - old[b, t]).item())
            weight = min(max(ratio, 1 - low), 1 + high)  # a float: no gradient through the weight
            total = total - weight * advantages[b, t].item() * logprobs[b, t]
            above, below, positions = above + (ratio > 1 + high), below + (ratio < 1 - low), positions + 1
    return total / positions, above / positions, below / positions


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("low,high", [(1.0, 0.2), (0.1, 0.5)])
def test_cispo_matches_loop(shape, low, high, gen):
    logprobs, old, advantages, mask = _inputs(shape, gen)
    out = cispo_policy_loss(logprobs, old, advantages, mask, clip_ratio_low=low, clip_ratio_high=high)
    loss, above, below = _loop_cispo(logprobs, old, advantages, mask, low, high)
    torch.testing.assert_close(out.loss, loss)
    assert (out.clipfrac.item(), out.clipfrac_lower.item()) == pytest.approx((above, below))
    torch.testing.assert_close(torch.autograd.grad(out.loss, logprobs)[0], torch.autograd.grad(loss, logprobs)[0])


def test_ppo_hand_worked():
    # Four tokens, old logprob 0, ratios r = 1.5, 1.5, 4, 0.5 and advantages 1, -1, -1, 1; eps 0.2, c = 3:
    #   r=1.5, A=1:  max(-1.5, -1.2) = -1.2  (clipped)
    #   r=1.5, A=-1: max(1.5, 1.2)   = 1.5
    #   r=4,   A=-1: max(4, 1.2) = 4, capped by the dual clip at -A c = 3
    #   r=0.5, A=1:  max(-0.5, -0.8) = -0.5
    # token-mean = (-1.2 + 1.5 + 3 - 0.5) / 4 = 0.7; clipfrac 1/4; clipfrac_lower 1/4
    # ppo_kl (k1, old - new = -ln r): -0.405465, -0.405465, -1.386294, 0.693147 -> mean -0.376019
    # ppo_kl_k3 (r - 1 - ln r): 0.094535, 0.094535, 1.613706, 0.193147 -> mean 0.498981
    logprobs = torch.log(torch.tensor([[1.5, 1.5, 4.0, 0.5]])).requires_grad_()
    out = ppo_policy_loss(logprobs, torch.zeros(1, 4), torch.tensor([[1.0, -1.0, -1.0, 1.0]]), torch.ones(1, 4))
    assert out.loss.item() == pytest.approx(0.7)
    assert (out.clipfrac.item(), out.clipfrac_lower.item()) == (0.25, 0.25)
    assert out.ppo_kl.item() == pytest.approx(-0.376019, abs=1e-6)
    assert out.ppo_kl_k3.item() == pytest.approx(0.498981, abs=1e-6)
    # d loss / d logprob = -A r / 4 where unclipped: 0 (clipped), 1.5 / 4, 0 (dual), -0.5 / 4
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    assert grad.flatten().tolist() == pytest.approx([0.0, 0.375, 0.0, -0.125])
    # clip-higher: eps_high 0.28 lets the first token reach r = 1.28 -> (-1.28 + 1.5 + 3 - 0.5) / 4 = 0.68
    higher = ppo_policy_loss(logprobs, torch.zeros(1, 4), torch.tensor([[1.0, -1.0, -1.0, 1.0]]), torch.ones(1, 4),
                             clip_ratio_high=0.28)
    assert higher.loss.item() == pytest.approx(0.68)


def test_gspo_hand_worked():
    # One sequence, token log ratios ln 2 and 0 -> s = exp(ln 2 / 2) = sqrt 2 = 1.414214.
    # A = 1, eps_high 0.2: max(-1.414214, -1.2) = -1.2 at both tokens (clipped, zero gradient).
    # A = -1: max(1.414214, 0.8) = 1.414214; gradient per token -A * s / 2 (token mean) = 0.707107.
    old = torch.tensor([[-1.0, -1.0]])
    logprobs = (old + torch.tensor([[math.log(2.0), 0.0]])).requires_grad_()
    mask = torch.ones(1, 2)
    up = gspo_policy_loss(logprobs, old, torch.ones(1, 2), mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert up.loss.item() == pytest.approx(-1.2) and up.clipfrac.item() == 1.0
    assert torch.autograd.grad(up.loss, logprobs)[0].abs().sum().item() == 0.0
    down = gspo_policy_loss(logprobs, old, -torch.ones(1, 2), mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert down.loss.item() == pytest.approx(math.sqrt(2.0))
    assert torch.autograd.grad(down.loss, logprobs)[0].flatten().tolist() == pytest.approx([0.707107, 0.707107])


def test_cispo_hand_worked():
    # old -1, logprob ln 2 - 1 = -0.306853 -> r = 2, weight clip(2, 0, 1.2) = 1.2, A = 1.
    # loss = -1.2 * 1 * (-0.306853) = 0.368224; gradient -1.2 (the clipped token still learns).
    logprobs = torch.tensor([[math.log(2.0) - 1.0]], requires_grad=True)
    out = cispo_policy_loss(logprobs, torch.tensor([[-1.0]]), torch.ones(1, 1), torch.ones(1, 1))
    assert out.loss.item() == pytest.approx(0.368224, abs=1e-6)
    assert out.clipfrac.item() == 1.0
    assert torch.autograd.grad(out.loss, logprobs)[0].item() == pytest.approx(-1.2)


def test_token_weights_multiply_each_token_loss_without_gradient(gen):
    logprobs, old, advantages, mask = _inputs((2, 4), gen)
    weights = torch.rand(2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    weighted = ppo_policy_loss(logprobs, old, advantages, mask, token_weights=weights).loss
    # Each token's own loss, isolated by a one-hot weight; the weighted loss is their weighted sum.
    expected = 0.0
    for b in range(2):
        for t in range(4):
            one_hot = torch.zeros(2, 4, dtype=torch.float64)
            one_hot[b, t] = 1.0
            expected += weights[b, t].item() * ppo_policy_loss(logprobs, old, advantages, mask,
                                                               token_weights=one_hot).loss.item()
    assert weighted.item() == pytest.approx(expected)
    weighted.backward()
    assert weights.grad is None and logprobs.grad is not None


@pytest.mark.parametrize("loss", [ppo_policy_loss, gspo_policy_loss, cispo_policy_loss])
def test_bad_inputs_raise(loss):
    with pytest.raises(ValueError, match=r"logprobs \(2, 3\).*advantages \(2, 4\)"):
        loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="clip ratios must be >= 0"):
        loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), clip_ratio_low=-0.1)


@pytest.mark.parametrize("loss", [ppo_policy_loss, gspo_policy_loss, cispo_policy_loss])
def test_ppo_kl_is_verls_mean_of_old_minus_new_logprobs(loss):
    # old - new per valid token: -1.5 - (-1) = -0.5 and -1 - (-2) = 1; the masked token (old - new = 7)
    # is left out: ppo_kl = (-0.5 + 1) / 2 = 0.25, whatever the loss. k3 = e^x - 1 - x of x = new - old:
    # e^0.5 - 1.5 = 0.148721 and e^-1 = 0.367879 -> 0.258300.
    logprobs = torch.tensor([[-1.0, -2.0, -8.0]])
    old = torch.tensor([[-1.5, -1.0, -1.0]])
    out = loss(logprobs, old, torch.ones(1, 3), torch.tensor([[1.0, 1.0, 0.0]]))
    assert out.ppo_kl.item() == pytest.approx(0.25)
    assert out.ppo_kl_k3.item() == pytest.approx(0.258300, abs=1e-6)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_dual must be > 1"):
        ppo_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip_ratio_dual=1.0)


def test_empty_mask_gives_zero_loss_and_metrics():
    out = ppo_policy_loss(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3))
    assert [out.loss.item(), out.clipfrac.item(), out.ppo_kl.item(), out.ppo_kl_k3.item()] == [0.0, 0.0, 0.0, 0.0]
