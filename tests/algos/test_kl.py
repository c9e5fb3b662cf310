import math

import pytest
import torch

from posttrain.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_k2,
    kl_k3_straight_through,
    kl_penalty,
)

from .helpers import SHAPES, random_mask, rows


def _loop_kl(x: float, kind: str) -> float:
    if kind in ("kl", "k1"):
        return x
    if kind == "abs":
        return abs(x)
    if kind in ("mse", "k2"):
        return 0.5 * x * x
    x = max(-20.0, min(20.0, x))
    return max(-10.0, min(10.0, math.exp(-x) - 1 + x))  # k3 and its straight-through variant


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", list(KL_ESTIMATORS))
def test_estimators_match_loop(shape, kind, gen):
    logprobs = -torch.rand(shape, generator=gen, dtype=torch.float64) * 4
    ref = -torch.rand(shape, generator=gen, dtype=torch.float64) * 4
    out = kl_penalty(logprobs, ref, kind)
    for b in range(shape[0]):
        for t in range(shape[1]):
            assert out[b, t].item() == pytest.approx(_loop_kl(logprobs[b, t].item() - ref[b, t].item(), kind))


def test_hand_worked_estimators():
    # x = log pi - log pi_ref = ln 2 = 0.693147:
    #   k1 = 0.693147; k2 = 0.5 * 0.480453 = 0.240227; k3 = exp(-ln 2) - 1 + ln 2 = 0.5 - 1 + 0.693147 = 0.193147
    logprobs, ref = torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1)
    assert kl_penalty(logprobs, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_penalty(logprobs, ref, "k2").item() == pytest.approx(0.240227, abs=1e-6)
    assert kl_penalty(logprobs, ref, "k3").item() == pytest.approx(0.193147, abs=1e-6)
    assert kl_penalty(-logprobs, ref, "abs").item() == pytest.approx(0.693147, abs=1e-6)
    # x = -30: k3 = exp(20) - 1 - 20 after the log-ratio clamp, then clamped to 10; finite gradient
    far = torch.tensor([[-30.0]], requires_grad=True)
    value = kl_penalty(far, torch.zeros(1, 1), "k3")
    value.sum().backward()
    assert value.item() == 10.0 and torch.isfinite(far.grad).all()


def test_straight_through_has_k3_value_and_k2_gradient(gen):
    logprobs = (-torch.rand(3, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    ref = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    straight = kl_k3_straight_through(logprobs, ref)
    torch.testing.assert_close(straight, kl_penalty(logprobs, ref, "k3"))
    (gradient,) = torch.autograd.grad(straight.sum(), logprobs)
    torch.testing.assert_close(gradient, torch.autograd.grad(kl_k2(logprobs, ref).sum(), logprobs)[0])
    torch.testing.assert_close(gradient, (logprobs - ref).detach())  # k2's gradient is x itself


@pytest.mark.parametrize("shape", SHAPES)
def test_apply_kl_penalty_matches_loop(shape, gen):
    rewards = torch.randn(shape, generator=gen, dtype=torch.float64)
    logprobs = -torch.rand(shape, generator=gen, dtype=torch.float64)
    ref = -torch.rand(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    out = apply_kl_penalty(rewards, logprobs, ref, mask, beta=0.1, kind="kl")
    per_sequence = []
    for b, valid in enumerate(rows(mask)):
        for t in range(shape[1]):
            x = logprobs[b, t].item() - ref[b, t].item()
            expected = rewards[b, t].item() - 0.1 * x if t in valid else 0.0
            assert out.rewards[b, t].item() == pytest.approx(expected)
        kls = [logprobs[b, t].item() - ref[b, t].item() for t in valid]
        per_sequence.append(sum(kls) / len(kls) if kls else 0.0)
    assert out.mean_kl.item() == pytest.approx(sum(per_sequence) / len(per_sequence))


def test_apply_kl_penalty_hand_worked():
    # reward 1 on the last valid token; KL (k1) 0.5 and 1 per token; beta 0.2 -> -0.1, 1 - 0.2 = 0.8; masked -> 0
    out = apply_kl_penalty(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([[0.5, 1.0, 2.0]]), torch.zeros(1, 3),
                           torch.tensor([[1, 1, 0]]), beta=0.2)
    assert out.rewards.flatten().tolist() == pytest.approx([-0.1, 0.8, 0.0])
    assert out.mean_kl.item() == 0.75


def test_controllers_hand_worked():
    fixed = FixedKLController(0.1)
    fixed.update(current_kl=5.0, n_steps=100)
    assert fixed.coef == 0.1
    # target 1, horizon 100, 10 steps. KL 1.1: error 0.1 -> coef * (1 + 0.1 * 10 / 100) = 0.2 * 1.01 = 0.202
    adaptive = AdaptiveKLController(0.2, target_kl=1.0, horizon=100)
    adaptive.update(current_kl=1.1, n_steps=10)
    assert adaptive.coef == pytest.approx(0.202)
    # KL 10: error clipped to 0.2 -> 0.202 * 1.02 = 0.20604; KL 0: error -0.2 -> 0.20604 * 0.98 = 0.2019192
    adaptive.update(current_kl=10.0, n_steps=10)
    assert adaptive.coef == pytest.approx(0.20604)
    adaptive.update(current_kl=0.0, n_steps=10)
    assert adaptive.coef == pytest.approx(0.2019192)
    restored = AdaptiveKLController(0.5, target_kl=1.0, horizon=100)
    restored.load_state_dict(adaptive.state_dict())
    assert restored.coef == adaptive.coef


def test_bad_kl_arguments():
    with pytest.raises(ValueError, match="valid names: kl, k1, abs"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "forward")
    with pytest.raises(ValueError, match=r"logprobs \(1, 2\).*ref_logprobs \(1, 3\)"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3), "k1")
    with pytest.raises(ValueError, match="target_kl and horizon must be > 0"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
