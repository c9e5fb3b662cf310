import pytest
import torch

from posttrain.algos import explained_variance, value_loss

from .helpers import SHAPES, random_mask, rows


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clip_range", [0.2, None])
def test_value_loss_matches_loop(shape, clip_range, gen):
    values = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    old = values.detach() + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    returns = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    total, clipped, count = 0.0, 0, 0
    for b, valid in enumerate(rows(mask)):
        for t in valid:
            v, r, o = values[b, t], returns[b, t].item(), old[b, t].item()
            unclipped = (v - r) ** 2
            if clip_range is None:
                term = unclipped
            else:
                clipped_error = (torch.clamp(v, o - clip_range, o + clip_range) - r) ** 2
                term = torch.maximum(unclipped, clipped_error)
                clipped += int(clipped_error.item() > unclipped.item())
            total, count = total + 0.5 * term, count + 1
    out = value_loss(values, old, returns, mask, clip_range=clip_range)
    torch.testing.assert_close(out.loss, total / count)
    assert out.clipfrac.item() == pytest.approx(clipped / count)
    torch.testing.assert_close(torch.autograd.grad(out.loss, values)[0], torch.autograd.grad(total / count, values)[0])


def test_value_loss_hand_worked():
    # v_old 0, v 1, R 2, clip 0.5: v_clip = 0.5; errors (1 - 2)^2 = 1 and (0.5 - 2)^2 = 2.25 -> 0.5 * 2.25 = 1.125
    # second token: v_old 0, v 0.25, R 0: v_clip = 0.25 (inside); error 0.0625 both -> 0.03125
    # token-mean: (1.125 + 0.03125) / 2 = 0.578125; clipfrac 1/2
    values = torch.tensor([[1.0, 0.25]], requires_grad=True)
    out = value_loss(values, torch.zeros(1, 2), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2), clip_range=0.5)
    assert out.loss.item() == pytest.approx(0.578125)
    assert out.clipfrac.item() == 0.5
    # The clipped branch has no gradient; the other: 0.5 * 2 * (0.25 - 0) / 2 = 0.125
    assert torch.autograd.grad(out.loss, values)[0].flatten().tolist() == pytest.approx([0.0, 0.125])


def test_a_value_inside_the_clip_range_is_never_counted_as_clipped():
    # float32, clip 0.5, each value well inside old +- 0.5, and the critic exact (returns = values):
    # nothing is clipped and the loss is 0. The form old + clip(v - old, -c, c) gives back
    # 0.1 - 7.5e-9, 0.001 - 1.7e-9 and 0.05 + 1.1e-8 after rounding, a squared error above 0,
    # and would count all three tokens as clipped.
    values = torch.tensor([[0.1, 0.001, 0.05]])
    old = torch.tensor([[0.3, 0.05, 0.3]])
    rounded = old + (values - old).clamp(-0.5, 0.5)
    assert (rounded != values).all()  # the case really rounds
    out = value_loss(values, old, values.clone(), torch.ones(1, 3), clip_range=0.5)
    assert out.clipfrac.item() == 0.0
    assert out.loss.item() == 0.0


def test_a_value_on_the_clip_bound_is_not_clipped():
    # old 0.5, clip 0.25, return 1: v = 0.75 sits exactly on the bound (binary fractions, no rounding),
    # stays 0.75, not clipped; one float32 step beyond (0.75 + 2^-24) is clamped back to 0.75, whose
    # error 0.0625 exceeds its own (0.25 - 2^-24)^2, and counts: clipfrac 1/2.
    values = torch.tensor([[0.75, 0.75 + 2**-24]])
    out = value_loss(values, torch.full((1, 2), 0.5), torch.ones(1, 2), torch.ones(1, 2), clip_range=0.25)
    assert out.clipfrac.item() == 0.5


@pytest.mark.parametrize("shape", SHAPES[1:])
def test_explained_variance_matches_loop(shape, gen):
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    returns = values + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
    mask = random_mask(*shape, gen)
    rs = [returns[b, t].item() for b, valid in enumerate(rows(mask)) for t in valid]
    errors = [returns[b, t].item() - values[b, t].item() for b, valid in enumerate(rows(mask)) for t in valid]

    def var(xs):
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)

    assert explained_variance(values, returns, mask).item() == pytest.approx(1 - var(errors) / var(rs))


def test_explained_variance_hand_worked_and_degenerate():
    # R = 1, 2, 3 (var 1); v = 1, 2, 2 -> errors 0, 0, 1 (mean 1/3, var (1/9 + 1/9 + 4/9) / 2 = 1/3) -> 2/3
    returns, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    assert explained_variance(torch.tensor([[1.0, 2.0, 2.0]]), returns, mask).item() == pytest.approx(2 / 3)
    assert explained_variance(returns, torch.ones(1, 3), mask).item() == 0.0  # constant returns
    assert explained_variance(returns, returns, torch.zeros(1, 3)).item() == 0.0  # nothing valid


def test_value_loss_bad_inputs():
    with pytest.raises(ValueError, match=r"values \(2, 3\).*returns \(2, 2\)"):
        value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="clip_range must be >= 0"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip_range=-1.0)
