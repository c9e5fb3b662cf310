import math

import pytest
import torch

from posttrain.algos import group_best_gap, group_normalize, group_stats


def _members(group_ids: torch.Tensor) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for index, group in enumerate(group_ids.tolist()):
        groups.setdefault(group, []).append(index)
    return groups


def _loop_mean_std(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return mean, math.sqrt(var)


@pytest.mark.parametrize("batch", [1, 6, 17])
@pytest.mark.parametrize("discrete", [False, True])
def test_group_stats_and_normalize_match_loops(batch, discrete, gen):
    scores = torch.randint(0, 2, (batch,), generator=gen).double() if discrete else torch.randn(batch, generator=gen,
                                                                                                 dtype=torch.float64)
    group_ids = torch.randint(-3, 3, (batch,), generator=gen) * 7  # arbitrary, non-adjacent ids
    stats = group_stats(scores, group_ids)
    normalized = group_normalize(scores, group_ids, eps=1e-6)
    for members in _members(group_ids).values():
        xs = [scores[i].item() for i in members]
        mean, std = _loop_mean_std(xs)
        for i in members:
            assert stats.mean[i].item() == pytest.approx(mean)
            assert stats.std[i].item() == pytest.approx(std)
            assert stats.count[i].item() == len(members)
            expected = 0.0 if max(xs) == min(xs) else (scores[i].item() - mean) / (std + 1e-6)
            assert normalized[i].item() == pytest.approx(expected)


@pytest.mark.parametrize("batch", [1, 6, 17])
def test_best_gap_matches_loop(batch, gen):
    scores = torch.randint(0, 4, (batch,), generator=gen).double()
    group_ids = torch.randint(0, 4, (batch,), generator=gen)
    gap = group_best_gap(scores, group_ids)
    for members in _members(group_ids).values():
        ranked = sorted(members, key=lambda i: (-scores[i].item(), i))
        for i in members:
            is_best = len(ranked) > 1 and i == ranked[0]
            expected = scores[ranked[0]].item() - scores[ranked[1]].item() if is_best else 0.0
            assert gap[i].item() == expected


def test_hand_worked_group():
    # group 5: scores 1, 2, 6 -> mean 3; deviations -2, -1, 3; var (4 + 1 + 9) / 2 = 7; std 2.645751
    # group 9: a single member -> 0. Best gap in group 5: 6 - 2 = 4 at index 3.
    scores = torch.tensor([1.0, 2.0, 8.0, 6.0])
    group_ids = torch.tensor([5, 5, 9, 5])
    normalized = group_normalize(scores, group_ids, eps=0.0)
    assert normalized.tolist() == pytest.approx([-2 / 2.645751, -1 / 2.645751, 0.0, 3 / 2.645751], abs=1e-6)
    assert group_best_gap(scores, group_ids).tolist() == [0.0, 0.0, 0.0, 4.0]


def test_equal_scores_centre_to_exactly_zero():
    # In float32, 0.1 - (7 * 0.1) / 7 = -7.45e-9; divided by std + eps = 1e-6 that is -0.00745, not 0.
    scores = torch.full((7,), 0.1)
    assert group_normalize(scores, torch.zeros(7, dtype=torch.long)).tolist() == [0.0] * 7


@pytest.mark.parametrize("group_ids", [torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.zeros(3, 1).long()])
def test_bad_group_ids_raise(group_ids):
    with pytest.raises(ValueError, match="group_ids"):
        group_normalize(torch.zeros(3), group_ids)
