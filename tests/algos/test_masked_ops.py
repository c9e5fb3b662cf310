import math

import pytest
import torch

from posttrain.algos import masked_mean, masked_sum, masked_var, masked_whiten

from .helpers import SHAPES, random_mask, rows


def _valid_values(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return [values[b, t].item() for b, positions in enumerate(rows(mask)) for t in positions]


def _loop_var(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_masked_reductions_match_loops(shape, gen):
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    xs = _valid_values(values, mask)
    assert masked_sum(values, mask).item() == pytest.approx(sum(xs))
    assert masked_mean(values, mask).item() == pytest.approx(sum(xs) / len(xs))
    assert masked_var(values, mask).item() == pytest.approx(_loop_var(xs))
    per_row = masked_mean(values, mask, dim=-1)
    for b, positions in enumerate(rows(mask)):
        expected = sum(values[b, t].item() for t in positions) / len(positions) if positions else 0.0
        assert per_row[b].item() == pytest.approx(expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_masked_whiten_matches_loop(shape, gen):
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = random_mask(*shape, gen)
    xs = _valid_values(values, mask)
    mean, var = sum(xs) / len(xs), _loop_var(xs)
    whitened = masked_whiten(values, mask)
    for b in range(shape[0]):
        for t in range(shape[1]):
            expected = (values[b, t].item() - mean) / math.sqrt(var + 1e-8) if mask[b, t] else 0.0
            assert whitened[b, t].item() == pytest.approx(expected)


def test_hand_worked_masked_stats():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 6.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # valid: 1, 2, 3, 7 -> sum 13, mean 3.25
    # squared deviations: 5.0625 + 1.5625 + 0.0625 + 14.0625 = 20.75; / (4 - 1) = 6.91666...
    assert masked_sum(values, mask).item() == 13.0
    assert masked_mean(values, mask).item() == 3.25
    assert masked_var(values, mask).item() == pytest.approx(20.75 / 3)
    # per row: (1 + 2) / 2 = 1.5 and (3 + 7) / 2 = 5
    assert masked_mean(values, mask, dim=-1).tolist() == [1.5, 5.0]
    # whitened 7: (7 - 3.25) / sqrt(6.91666) = 3.75 / 2.62996 = 1.42588
    assert masked_whiten(values, mask)[1, 2].item() == pytest.approx(1.42588, abs=1e-5)


def test_padding_garbage_and_empty_masks_give_zeros_not_nan():
    values = torch.tensor([[1.0, float("-inf")], [float("nan"), 2.0]])
    mask = torch.tensor([[1, 0], [0, 0]], dtype=torch.bool)
    assert masked_sum(values, mask).item() == 1.0
    assert masked_mean(values, mask, dim=-1).tolist() == [1.0, 0.0]
    assert masked_var(values, mask).item() == 0.0  # one valid entry: no spread
    empty = torch.zeros(2, 2)
    assert masked_mean(values, empty).item() == 0.0
    assert masked_whiten(values, empty).abs().sum().item() == 0.0


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"values \(2, 3\).*mask \(2, 4\)"):
        masked_mean(torch.zeros(2, 3), torch.ones(2, 4))
