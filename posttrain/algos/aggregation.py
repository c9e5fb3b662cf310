"""Reduce a per-token loss (B, T) to the scalar that is back-propagated.

| loss_agg_mode            | loss                                                   | normaliser N (global)        |
|--------------------------|--------------------------------------------------------|------------------------------|
| token-mean               | sum_{i,t} m_it l_it / N                                | valid tokens                 |
| seq-mean-token-sum       | sum_i (sum_t m_it l_it) / N                            | non-empty sequences          |
| seq-mean-token-mean      | sum_i (sum_t m_it l_it / sum_t m_it) / N               | non-empty sequences          |
| seq-mean-token-sum-norm  | sum_i (sum_t m_it l_it) / (N * L)                      | non-empty sequences; L fixed |

Names follow verl. token-mean is DAPO's choice (Yu et al. 2025), seq-mean-token-mean is the GRPO
paper's (Shao et al. 2024) and GSPO's, seq-mean-token-sum-norm is Dr.GRPO's constant normaliser
(Liu et al. 2025), where L is the maximum response length (`max_response_length`, default: this
batch's T; pass the configured maximum so that every micro-batch uses the same L).

seq-mean-token-sum-norm differs from verl by default. Here it is a mean over sequences of
(token sum / L), so the loss does not grow with the batch size. verl's `agg_loss` divides the
summed sequence losses by its `loss_scale_factor` only (default: the micro-batch's T), not by the
number of sequences:

    verl convention (loss_scale_factor = K)   sum_i (sum_t m_it l_it) / K

Pass `loss_scale_factor` to get verl's convention (with K = L the loss is N times ours). K is a
constant, so the micro-batch losses still add up to the full-batch loss; `global_normalizer` and
`max_response_length` are then unused. verl's default K (each micro-batch's own T) is not offered:
it changes with the padding of each micro-batch. `loss_scale_factor` with any other mode is an
error (verl ignores it there).

Gradient accumulation and data parallelism. Every mode is a sum over sequences divided by a
normaliser. When the normaliser is the *global* one, counted over the whole mini-batch on all
ranks (`loss_normalizer` on each piece, summed, e.g. with an all-reduce), the losses of any split
into micro-batches add up to the full-batch loss, and so do their gradients: no rescaling by the
number of micro-batches or ranks is needed (a data-parallel all-reduce must then *sum* gradients,
or the caller multiplies by the world size before a mean all-reduce). Without a global
normaliser each call normalises by its own counts, which is right only for a single whole batch.

Sequences whose mask is all 0 (padding rows added to divide a batch evenly) count neither as
tokens nor as sequences. An empty normaliser (0) gives a loss of 0, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algos.utils import check_same_shape, masked_sum

__all__ = ["LOSS_AGG_MODES", "loss_normalizer", "aggregate_loss"]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _check_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")


def loss_normalizer(response_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """This piece's share of the global normaliser: valid tokens or non-empty sequences.  # (B, T) -> ()

    Sum it over all micro-batches and ranks of a mini-batch and pass the total to `aggregate_loss`.
    """
    _check_mode(loss_agg_mode)
    valid = response_mask != 0
    if loss_agg_mode == "token-mean":
        return valid.sum().to(torch.float32)
    return valid.any(dim=-1).sum().to(torch.float32)


def _per_sequence_sums(per_token_loss: Tensor, response_mask: Tensor, loss_agg_mode: str) -> Tensor:
    # (B, T) -> (B,): what each sequence contributes to the numerator.
    sums = masked_sum(per_token_loss, response_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        lengths = (response_mask != 0).sum(dim=-1).to(sums.dtype)
        sums = torch.where(lengths > 0, sums / lengths.clamp_min(1), torch.zeros_like(sums))
    return sums


def aggregate_loss(
    per_token_loss: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_normalizer: Tensor | float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Scalar loss from per-token losses under `loss_agg_mode`.  # (B, T), (B, T) -> ()

    `global_normalizer`: the summed `loss_normalizer` of every piece of the mini-batch; None uses
    this batch's own. `max_response_length`: L of seq-mean-token-sum-norm (default T).
    `loss_scale_factor`: K of verl's seq-mean-token-sum-norm, sum_i (sum_t m l) / K (None: ours,
    sum_i (sum_t m l) / (N L)).
    """
    check_same_shape(per_token_loss=per_token_loss, response_mask=response_mask)
    _check_mode(loss_agg_mode)
    if loss_scale_factor is not None:
        return _verl_token_sum_norm(per_token_loss, response_mask, loss_agg_mode, loss_scale_factor)
    if global_normalizer is None:
        global_normalizer = loss_normalizer(response_mask, loss_agg_mode)
    elif isinstance(global_normalizer, (int, float)) and global_normalizer < 0:
        # Only plain numbers are checked: reading a device tensor here would stall the GPU each step.
        raise ValueError(f"global_normalizer must be >= 0 (a count of tokens or sequences); got {global_normalizer}")
    # At least float32: a bf16 count of 10^5 tokens is not exact.
    dtype = torch.promote_types(per_token_loss.dtype, torch.float32)
    normalizer = torch.as_tensor(global_normalizer, dtype=dtype, device=per_token_loss.device)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        length = per_token_loss.shape[-1] if max_response_length is None else max_response_length
        if length < 1:
            raise ValueError(f"max_response_length must be >= 1; got {max_response_length}")
        normalizer = normalizer * length
    total = _per_sequence_sums(per_token_loss, response_mask, loss_agg_mode).sum()
    return torch.where(normalizer > 0, total / normalizer.clamp_min(1e-12), torch.zeros_like(total))


def _verl_token_sum_norm(per_token_loss: Tensor, response_mask: Tensor, loss_agg_mode: str,
                         loss_scale_factor: float) -> Tensor:
    # verl's seq-mean-token-sum-norm: the summed sequence losses over a constant, no count of sequences.
    if loss_agg_mode != "seq-mean-token-sum-norm":
        raise ValueError(f"loss_scale_factor applies to loss_agg_mode seq-mean-token-sum-norm only; got "
                         f"{loss_agg_mode!r}: drop loss_scale_factor or use seq-mean-token-sum-norm")
    if not loss_scale_factor > 0:
        raise ValueError(f"loss_scale_factor must be > 0 (e.g. the maximum response length); got {loss_scale_factor}")
    total = _per_sequence_sums(per_token_loss, response_mask, loss_agg_mode).sum()
    return total.to(torch.promote_types(total.dtype, torch.float32)) / loss_scale_factor
