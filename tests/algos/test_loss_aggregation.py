import pytest
import torch

from posttrain.algos import LOSS_AGG_MODES, aggregate_loss, loss_normalizer

from .helpers import SHAPES, random_mask, rows


def _loop_aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, length: int) -> float:
    per_row = [[loss[b, t].item() for t in positions] for b, positions in enumerate(rows(mask))]
    non_empty = [xs for xs in per_row if xs]
    if mode == "token-mean":
        return sum(sum(xs) for xs in per_row) / sum(len(xs) for xs in per_row)
    if mode == "seq-mean-token-sum":
        return sum(sum(xs) for xs in non_empty) / len(non_empty)
    if mode == "seq-mean-token-mean":
        return sum(sum(xs) / len(xs) for xs in non_empty) / len(non_empty)
    return sum(sum(xs) for xs in non_empty) / (len(non_empty) * length)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_modes_match_loops(shape, mode, gen):
    loss = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    expected = _loop_aggregate(loss, mask, mode, shape[1])
    assert aggregate_loss(loss, mask, mode).item() == pytest.approx(expected)


def test_hand_worked_modes():
    # Row 0: losses 1, 2, 3 (all valid); row 1: 4 valid, 5 masked; row 2: empty.
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == 2.5  # (1 + 2 + 3 + 4) / 4
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == 5.0  # (6 + 4) / 2
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == 3.0  # (6/3 + 4/1) / 2
    # Dr.GRPO: (6 + 4) / (2 sequences * L = 10) = 0.5; with the batch's T = 3: 10 / 6
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_response_length=10).item() == 0.5
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / 6)
    # A global normaliser of 8 tokens (this piece holds 4 of them) halves the token mean: 10 / 8
    assert aggregate_loss(loss, mask, "token-mean", global_normalizer=8).item() == 1.25
    assert loss_normalizer(mask, "token-mean").item() == 4
    assert loss_normalizer(mask, "seq-mean-token-mean").item() == 2  # the empty row does not count


def test_loss_scale_factor_is_verls_token_sum_norm():
    # The rows of test_hand_worked_modes: sequence sums 6 and 4, the empty row adds nothing.
    # verl's agg_loss: (6 + 4) / loss_scale_factor, with no division by the 2 sequences;
    # posttrain's default with the same L = 10: (6 + 4) / (2 * 10).
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == 1.0
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_response_length=10).item() == 0.5
    # The divisor is the factor alone: a global normaliser or a maximum length does not enter.
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=4, global_normalizer=7,
                          max_response_length=10).item() == 2.5


def test_loss_scale_factor_split_sums_to_the_full_batch(gen):
    loss = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = random_mask(6, 5, gen)
    full = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=8)
    halves = [aggregate_loss(loss[piece], mask[piece], "seq-mean-token-sum-norm", loss_scale_factor=8)
              for piece in (slice(0, 2), slice(2, 6))]
    torch.testing.assert_close(halves[0] + halves[1], full)
    torch.testing.assert_close(full, (loss * mask).sum() / 8)


def _random_split(batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(batch, generator=gen)
    cuts = sorted(torch.randperm(batch - 1, generator=gen)[: int(torch.randint(0, batch, (1,), generator=gen))] + 1)
    return list(torch.tensor_split(order, [int(c) for c in cuts]))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("trial", range(3))
def test_any_micro_batch_split_sums_to_the_full_batch(mode, trial, gen):
    # Micro-batches are also trimmed to their own longest response, as a packing collator would.
    batch, length = 9, 11
    params = torch.randn(batch, length, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = random_mask(batch, length, gen)

    def per_token(p: torch.Tensor) -> torch.Tensor:
        return p**2 * torch.sin(p)

    full = aggregate_loss(per_token(params), mask, mode, max_response_length=length)
    (full_grad,) = torch.autograd.grad(full, params)
    pieces = _random_split(batch, gen)
    normalizer = sum(loss_normalizer(mask[piece], mode) for piece in pieces)
    total = torch.zeros((), dtype=torch.float64)
    for piece in pieces:
        valid_columns = (mask[piece] != 0).any(0).nonzero()
        width = int(valid_columns.max()) + 1 if len(valid_columns) else 1
        total = total + aggregate_loss(per_token(params[piece, :width]), mask[piece, :width], mode,
                                       global_normalizer=normalizer, max_response_length=length)
    (split_grad,) = torch.autograd.grad(total, params)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_grad, full_grad)


def test_zero_normaliser_gives_zero_loss_and_gradient():
    params = torch.ones(2, 3, requires_grad=True)
    loss = aggregate_loss(params * 5, torch.zeros(2, 3), "token-mean")
    loss.backward()
    assert loss.item() == 0.0 and params.grad.abs().sum().item() == 0.0


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="valid modes: token-mean, seq-mean-token-sum"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match="global_normalizer must be >= 0"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), global_normalizer=-1)
    with pytest.raises(ValueError, match=r"per_token_loss \(2, 3\).*response_mask \(3, 2\)"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="loss_scale_factor applies to loss_agg_mode seq-mean-token-sum-norm only"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "token-mean", loss_scale_factor=3)
    with pytest.raises(ValueError, match="loss_scale_factor must be > 0"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-sum-norm", loss_scale_factor=0)
