import math

import pytest
import torch

from posttrain.algos import IMPORTANCE_LEVELS, decoupled_ppo_policy_loss, logprob_gap, ppo_policy_loss, rollout_importance_weights

from .helpers import SHAPES, random_mask, rows


def _loop_weights(old, behaviour, mask, level, mode, upper, lower):
    out = [[0.0] * old.shape[1] for _ in range(old.shape[0])]
    for b, valid in enumerate(rows(mask)):
        logs = [old[b, t].item() - behaviour[b, t].item() for t in valid]
        for k, t in enumerate(valid):
            log_w = {"token": logs[k], "sequence": sum(logs), "geometric": sum(logs) / len(logs)}[level]
            w = math.exp(max(-20.0, min(20.0, log_w)))
            if mode == "truncate":
                out[b][t] = w if upper is None else min(w, upper)
            else:
                inside = lower <= w <= upper
                out[b][t] = (w if mode == "mask" else 1.0) if inside else 0.0
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", IMPORTANCE_LEVELS)
@pytest.mark.parametrize("mode,upper,lower", [("truncate", 2.0, None), ("truncate", None, None),
                                              ("mask", 2.0, None), ("reject", 1.5, 0.8)])
def test_weights_match_loop(shape, level, mode, upper, lower, gen):
    old = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    behaviour = old + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
    mask = random_mask(*shape, gen)
    out = rollout_importance_weights(old, behaviour, mask, level=level, mode=mode, upper=upper, lower=lower)
    effective_lower = lower if lower is not None else (1 / upper if upper else 0.0)
    expected = _loop_weights(old, behaviour, mask, level, mode, upper, effective_lower)
    torch.testing.assert_close(out.weights, torch.tensor(expected, dtype=torch.float64))


def test_hand_worked_weights():
    # Token log-ratios ln 3, ln 0.25, 0 -> token weights 3, 0.25, 1.
    #   truncate at 2: 2, 0.25, 1 (one truncated of three)
    #   mask [0.5, 2]: 0, 0, 1 (one kept of three)
    #   sequence: 3 * 0.25 * 1 = 0.75 for every token; geometric: 0.75^(1/3) = 0.908560
    behaviour = torch.zeros(1, 3)
    old = torch.log(torch.tensor([[3.0, 0.25, 1.0]]))
    mask = torch.ones(1, 3)
    truncated = rollout_importance_weights(old, behaviour, mask, upper=2.0)
    assert truncated.weights.flatten().tolist() == pytest.approx([2.0, 0.25, 1.0])
    assert truncated.truncated_fraction.item() == pytest.approx(1 / 3)
    assert truncated.mean_raw_weight.item() == pytest.approx((3 + 0.25 + 1) / 3)
    masked = rollout_importance_weights(old, behaviour, mask, mode="mask", upper=2.0)
    assert masked.weights.flatten().tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert masked.kept_fraction.item() == pytest.approx(1 / 3)
    sequence = rollout_importance_weights(old, behaviour, mask, level="sequence", upper=None)
    assert sequence.weights.flatten().tolist() == pytest.approx([0.75] * 3)
    geometric = rollout_importance_weights(old, behaviour, mask, level="geometric", mode="reject", upper=2.0)
    assert geometric.weights.flatten().tolist() == [1.0, 1.0, 1.0]  # 0.908560 lies in [0.5, 2]


def test_sequence_level_drops_whole_sequences():
    # Row 0's product 4 * 1 = 4 leaves [0.5, 2]: both its tokens go; row 1 (product 1) stays.
    old = torch.log(torch.tensor([[4.0, 1.0], [2.0, 0.5]]))
    out = rollout_importance_weights(old, torch.zeros(2, 2), torch.ones(2, 2), level="sequence", mode="reject")
    assert out.weights.tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_decoupled_loss_is_ppo_around_proximal_weighted_by_proximal_over_behaviour(gen):
    shape = (4, 6)
    proximal = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    behaviour = proximal + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    logprobs = (proximal + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3).requires_grad_()
    advantages = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    out = decoupled_ppo_policy_loss(logprobs, proximal, behaviour, advantages, mask, behaviour_weight_cap=1.5,
                                    clip_ratio_high=0.28)
    # The same thing spelled out token by token: w = min(pi_prox / mu, 1.5), PPO terms around pi_prox.
    total, count = 0.0, 0
    for b, valid in enumerate(rows(mask)):
        for t in valid:
            w = min(math.exp(proximal[b, t].item() - behaviour[b, t].item()), 1.5)
            ratio = torch.exp(logprobs[b, t] - proximal[b, t])
            a = advantages[b, t].item()
            term = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.28))
            term = torch.minimum(term, torch.tensor(-a * 3.0, dtype=torch.float64)) if a < 0 else term
            total, count = total + w * term, count + 1
    torch.testing.assert_close(out.loss, total / count)
    torch.testing.assert_close(torch.autograd.grad(out.loss, logprobs)[0],
                               torch.autograd.grad(total / count, logprobs)[0])


def test_decoupled_loss_equals_ppo_when_behaviour_is_proximal(gen):
    proximal = -torch.rand(3, 4, generator=gen)
    logprobs = proximal + 0.1
    advantages, mask = torch.randn(3, 4, generator=gen), torch.ones(3, 4)
    torch.testing.assert_close(decoupled_ppo_policy_loss(logprobs, proximal, proximal, advantages, mask).loss,
                               ppo_policy_loss(logprobs, proximal, advantages, mask).loss)


def test_bad_options_raise():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="valid levels: token, sequence, geometric"):
        rollout_importance_weights(*args, level="episode")
    with pytest.raises(ValueError, match="valid modes: truncate, mask, reject"):
        rollout_importance_weights(*args, mode="clip")
    with pytest.raises(ValueError, match="lower applies only to mode"):
        rollout_importance_weights(*args, lower=0.5)
    with pytest.raises(ValueError, match="needs an interval"):
        rollout_importance_weights(*args, mode="mask", upper=None)
    with pytest.raises(ValueError, match=r"old_logprobs \(1, 2\).*behaviour_logprobs \(1, 3\)"):
        rollout_importance_weights(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))


def test_logprob_gap_is_the_absolute_difference_on_valid_tokens_only():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    behaviour = torch.tensor([[-1.1, -1.8, -3.0], [-0.2, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token's gap of 9 is padding
    gap = logprob_gap(old, behaviour, mask)
    assert gap.tokens == 5 and math.isclose(gap.max, 0.3, abs_tol=1e-6)
    assert math.isclose(gap.mean, (0.1 + 0.2 + 0.0 + 0.3 + 0.0) / 5, abs_tol=1e-6)
    assert logprob_gap(old, behaviour, torch.zeros_like(mask)) is None
    with pytest.raises(ValueError):
        logprob_gap(old, behaviour[:, :2], mask)
