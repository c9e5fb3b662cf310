"""Per-group statistics of per-sequence scores, for the outcome-reward estimators.

A group is the set of responses sampled for one prompt; `group_ids` (B,) is an integer tensor
holding the same id for every member (any integers, in any order; members need not be adjacent).
Every function here takes scores (B,) and group ids (B,) and returns a per-sample tensor (B,), each
sample receiving the statistic of its own group, so that the estimators stay one vectorised line.

The standard deviation is Bessel-corrected (n - 1), as `torch.std` and verl's GRPO; a group of one
has standard deviation 0.

A group whose scores are all equal is detected exactly (max == min) and centred to exactly 0: the
float mean of equal numbers can differ from them in the last bit, and dividing that residue by a
standard deviation of 0 plus a small epsilon would turn it into a visible advantage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algos.utils import check_group_ids

__all__ = ["GroupStats", "group_stats", "group_normalize", "group_best_gap"]


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each sample's own group, all (B,)."""

    mean: Tensor
    std: Tensor  # Bessel-corrected; 0 for a group of one
    count: Tensor  # group size, in the scores' dtype
    constant: Tensor  # bool: every member of the group has the same score


def _group_index(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, int]:
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,), one per sequence; got shape {tuple(scores.shape)}")
    check_group_ids(group_ids, scores.shape[0])
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _per_group(values: Tensor, inverse: Tensor, num_groups: int, reduce: str) -> Tensor:
    # (B,) -> (G,); "sum" adds, "amax"/"amin" take extremes (include_self=False ignores the fill 0).
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, inverse, values, reduce=reduce, include_self=False)


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Mean, std, size and constancy of each sample's group.  # (B,), (B,) -> 4 x (B,)"""
    inverse, num_groups = _group_index(scores, group_ids)
    count = _per_group(torch.ones_like(scores), inverse, num_groups, "sum")
    mean = _per_group(scores, inverse, num_groups, "sum") / count
    squared = _per_group((scores - mean[inverse]) ** 2, inverse, num_groups, "sum")
    std = torch.where(count > 1, squared / (count - 1).clamp_min(1), torch.zeros_like(squared)).sqrt()
    spread = _per_group(scores, inverse, num_groups, "amax") - _per_group(scores, inverse, num_groups, "amin")
    return GroupStats(mean[inverse], std[inverse], count[inverse], (spread == 0)[inverse])


def group_normalize(scores: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    """(score - group mean) / (group std + eps), or without the division.  # (B,), (B,) -> (B,)

    A group of one, or a group of equal scores, gets exactly 0.
    """
    stats = group_stats(scores, group_ids)
    centred = scores - stats.mean
    if scale_by_std:
        centred = centred / (stats.std + eps)
    return torch.where(stats.constant, torch.zeros_like(centred), centred)


def group_best_gap(scores: Tensor, group_ids: Tensor) -> Tensor:
    """Best score minus second-best at the group's best sample, 0 elsewhere.  # (B,), (B,) -> (B,)

    Ties for the best give a gap of 0, so which tied sample is "best" does not matter (the lowest
    index is used). A group of one has no second best and gets 0.
    """
    inverse, num_groups = _group_index(scores, group_ids)
    best = _per_group(scores, inverse, num_groups, "amax")
    positions = torch.arange(scores.shape[0], device=scores.device)
    at_best = scores == best[inverse]
    not_best = torch.full_like(positions, scores.shape[0])
    best_position = _per_group(torch.where(at_best, positions, not_best), inverse, num_groups, "amin")
    is_best = positions == best_position[inverse]
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
    second = _per_group(others, inverse, num_groups, "amax")
    gap = torch.where(torch.isfinite(second), best - second, torch.zeros_like(best))
    return torch.where(is_best, gap[inverse], torch.zeros_like(scores))
