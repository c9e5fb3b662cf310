"""Critic loss with value clipping, and the explained variance of values against returns.

    v_clip  = clamp(v, v_old - c, v_old + c)
    loss_t  = 0.5 * max((v - R)^2, (v_clip - R)^2)          aggregated by `loss_agg_mode`

This is the clipped value loss of the PPO reference implementation (OpenAI baselines ppo2; see
Engstrom et al. 2020, "Implementation matters in deep policy gradients", for why it is a
pessimistic bound rather than a trust region). `clipfrac` is the share of valid tokens where the
clipped error was larger (the clipped branch was taken). `clip_range=None` disables clipping.
v_clip is a clamp of v itself, as in verl, not v_old + clip(v - v_old, -c, c): that form equals
v_clip in real arithmetic, but in floating point v_old + (v - v_old) need not round back to v, so
a value inside the range could count as clipped and take the clipped branch's (zero) gradient.

    explained_variance = 1 - Var[R - v] / Var[R]     over valid tokens

1 is a perfect critic, 0 no better than a constant, negative worse. Where Var[R] is 0 (constant
returns, or fewer than two valid tokens) the ratio is undefined; it is reported as 0 so metrics
stay finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algos.aggregation import aggregate_loss
from posttrain.algos.utils import check_same_shape, masked_mean, masked_var

__all__ = ["ValueLossOutput", "value_loss", "explained_variance"]


@dataclass(frozen=True)
class ValueLossOutput:
    loss: Tensor  # () differentiable
    clipfrac: Tensor  # () detached


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    clip_range: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
    global_normalizer: Tensor | float | None = None,
    max_response_length: int | None = None,
) -> ValueLossOutput:
    """Clipped value loss 0.5 * max((v - R)^2, (v_clip - R)^2).  # 4 x (B, T) -> ValueLossOutput"""
    check_same_shape(values=values, old_values=old_values, returns=returns, response_mask=response_mask)
    unclipped = (values - returns) ** 2
    if clip_range is None:
        per_token, clip_taken = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        if clip_range < 0:
            raise ValueError(f"clip_range must be >= 0 (or None to disable value clipping); got {clip_range}")
        old = old_values.detach()
        clipped_values = torch.clamp(values, old - clip_range, old + clip_range)
        clipped = (clipped_values - returns) ** 2
        per_token, clip_taken = torch.maximum(unclipped, clipped), clipped > unclipped
    loss = 0.5 * aggregate_loss(per_token, response_mask, loss_agg_mode,
                                global_normalizer=global_normalizer, max_response_length=max_response_length)
    return ValueLossOutput(loss, masked_mean(clip_taken.float(), response_mask).detach())


def explained_variance(values: Tensor, returns: Tensor, response_mask: Tensor) -> Tensor:
    """1 - Var[R - v] / Var[R] over valid tokens; 0 where Var[R] is 0.  # 3 x (B, T) -> ()"""
    check_same_shape(values=values, returns=returns, response_mask=response_mask)
    values, returns = values.detach().float(), returns.detach().float()
    var_returns = masked_var(returns, response_mask)
    ratio = masked_var(returns - values, response_mask) / var_returns.clamp_min(torch.finfo(var_returns.dtype).tiny)
    return torch.where(var_returns > 0, 1.0 - ratio, torch.zeros_like(var_returns))
