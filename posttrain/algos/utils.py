"""Masked reductions and input checks shared by every estimator and loss in `posttrain.algos`.

Shapes: `B` sequences (rows), `T` response positions (columns). A response mask is 1 (or True)
where a position holds a token the loss may see and 0 at padding and at observation tokens of a
multi-turn episode. Any dtype is accepted for a mask (bool, int or float); it is read as `mask != 0`.

Masked reductions never multiply by the mask: they select with `torch.where`, so that padding
positions holding `-inf` or NaN (a logprob of a pad token, say) cannot leak into a sum as `0 * inf`.
A reduction over no valid position returns 0, never NaN.

The variance is Bessel-corrected (divides by n - 1), as verl's `masked_var`; with fewer than two
valid entries it is 0. Whitening follows the usual PPO practice ((x - mean) / sqrt(var + eps)) over
all valid entries of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "check_same_shape",
    "check_finite",
    "check_group_ids",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
]


def check_same_shape(**named: Tensor) -> None:
    """Raise ValueError naming every shape unless all tensors given share one shape."""
    shapes = {name: tuple(t.shape) for name, t in named.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shapes disagree: {listed}; they must all have the same shape")


def check_finite(name: str, values: Tensor) -> None:
    """Raise ValueError naming the first sample indices (dim 0) of `values` that hold NaN or inf."""
    bad = ~torch.isfinite(values)
    if bad.any():
        rows = bad.reshape(bad.shape[0], -1).any(dim=1) if bad.dim() > 0 else bad.reshape(1)
        indices = torch.nonzero(rows).flatten().tolist()
        shown = ", ".join(str(i) for i in indices[:8]) + (" ..." if len(indices) > 8 else "")
        raise ValueError(
            f"{name} holds NaN or inf at sample index {shown} ({len(indices)} samples); "
            "fix the reward/score function that produced them"
        )


def check_group_ids(group_ids: Tensor, batch_size: int) -> None:
    """Raise ValueError unless `group_ids` is an integer tensor of shape (batch_size,)."""
    if group_ids.dim() != 1 or group_ids.shape[0] != batch_size:
        raise ValueError(
            f"group_ids has shape {tuple(group_ids.shape)}; expected ({batch_size},), one id per sequence"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(
            f"group_ids has dtype {group_ids.dtype}; expected an integer tensor (e.g. the prompt index)"
        )


def _valid(mask: Tensor) -> Tensor:
    return mask != 0


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is set.  # (..., ) -> () or reduced over `dim`"""
    check_same_shape(values=values, mask=mask)
    selected = torch.where(_valid(mask), values, torch.zeros_like(values))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def _count(mask: Tensor, dim: int | None, dtype: torch.dtype) -> Tensor:
    valid = _valid(mask).to(dtype)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over valid entries; 0 where nothing is valid.  # (B, T) -> () or (B,)"""
    total = masked_sum(values, mask, dim)
    count = _count(mask, dim, total.dtype)
    return torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(total))


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """Bessel-corrected variance over all valid entries; 0 with fewer than two.  # (B, T) -> ()"""
    mean = masked_mean(values, mask)
    squared = masked_sum((values - mean) ** 2, mask)
    count = _count(mask, None, squared.dtype)
    return torch.where(count > 1, squared / (count - 1).clamp_min(1), torch.zeros_like(squared))


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over valid entries; 0 at invalid ones.  # (B, T) -> (B, T)

    With `shift_mean=False` the mean is added back (scale only), as verl offers.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_valid(mask), whitened, torch.zeros_like(whitened))
