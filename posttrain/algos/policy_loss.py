"""Policy-gradient losses: PPO (clip-higher, dual clip), GSPO and CISPO.

Every loss takes (all (B, T)) `logprobs` (current policy, differentiable), `old_logprobs` (the
policy the advantages were computed for), `advantages` and `response_mask`, and returns
`PolicyLossOutput(loss, clipfrac, clipfrac_lower, ppo_kl, ppo_kl_k3)`, all scalars:

- `loss` is the aggregated loss (see `posttrain.algos.aggregation`: `loss_agg_mode`,
  `global_normalizer`, `max_response_length`, `loss_scale_factor` are passed through), the only
  differentiable field.
- `clipfrac`: share of valid tokens where the clip bound took effect (PPO, GSPO: the clipped branch
  of the min was taken; CISPO: the importance weight hit its upper bound).
- `clipfrac_lower`: share of valid tokens where PPO's dual clip took effect (CISPO: the weight hit
  its lower bound; GSPO: always 0).
- `ppo_kl`: masked mean of log old - log new, the k1 estimate of KL(old || new): verl's
  `ppo_kl` (the metric `actor/ppo_kl`). Unbiased, but a single batch can make it negative.
- `ppo_kl_k3`: masked mean of the k3 estimate of the same KL, (r - 1) - log r with r = new / old
  (Schulman 2020, "Approximating KL divergence"): never negative and lower in variance.
  Both read the clamped log-ratio below (GSPO: the token log-ratio, not the sequence one).
Metrics are means over this call's valid tokens (not globally normalised).

`token_weights` (B, T), optional, multiplies the per-token loss before aggregation and carries no
gradient: off-policy importance weights and rejection masks from `posttrain.algos.off_policy`.

Per-token loss by config name, r = pi / pi_old:

    vanilla, ppo  max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), capped at -A c where A < 0
                  (Schulman et al. 2017; clip-higher: Yu et al. 2025, DAPO; dual clip: Ye et al. 2020)
    gspo          as ppo without the dual clip, r replaced by s_i = exp(mean_t log r_it) of the
                  sequence (Zheng et al. 2025, GSPO, token-level form)
    cispo         -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi  (MiniMax 2025, MiniMax-M1)

GSPO: the token-level form s_it = sg(s_i) * pi_t / sg(pi_t) has the value s_i and the gradient
s_i * grad log pi_t at each token, so that per-token advantages remain possible; with one
advantage per sequence and seq-mean-token-mean aggregation (the paper's, and this function's
default) its gradient equals the sequence-level objective's. The default clip range is the paper's
(3e-4, 4e-4), far narrower than PPO's because s_i is a geometric mean.

CISPO: the loss value is not a surrogate of the return (its gradient is what matters). The paper
imposes no lower bound on the weight; the default `clip_ratio_low=1.0` reproduces that (a lower
bound of 0 never binds). The default upper range 0.2 is a starting point, not the paper's value.

Log-ratios are clamped to [-20, 20] before exponentiation so that a wildly stale logprob cannot
produce inf (and NaN gradients); beyond that range the token's gradient is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algos.aggregation import aggregate_loss
from posttrain.algos.utils import check_same_shape, masked_mean

__all__ = ["LOG_RATIO_LIMIT", "PolicyLossOutput", "clamped_log_ratio", "ppo_policy_loss", "gspo_policy_loss",
           "cispo_policy_loss"]

# exp(20) ~ 5e8: far beyond any clip range, yet finite in float32 and bf16.
LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: Tensor  # () differentiable
    clipfrac: Tensor  # () detached
    clipfrac_lower: Tensor  # () detached
    ppo_kl: Tensor  # () detached, k1
    ppo_kl_k3: Tensor  # () detached


def clamped_log_ratio(logprobs: Tensor, reference_logprobs: Tensor) -> Tensor:
    """log(pi / pi_ref) clamped to [-20, 20].  # (B, T), (B, T) -> (B, T)"""
    return (logprobs - reference_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _check_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                  token_weights: Tensor | None) -> None:
    named = {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": advantages,
             "response_mask": response_mask}
    if token_weights is not None:
        named["token_weights"] = token_weights
    check_same_shape(**named)


def _fraction(condition: Tensor, response_mask: Tensor) -> Tensor:
    return masked_mean(condition.float(), response_mask).detach()


def _kl_metrics(log_ratio: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    # log_ratio = log new - log old; k1 of KL(old || new) is its negation.
    log_ratio = log_ratio.detach()
    return masked_mean(-log_ratio, response_mask), masked_mean(torch.expm1(log_ratio) - log_ratio, response_mask)


def _aggregate(per_token_loss: Tensor, response_mask: Tensor, token_weights: Tensor | None,
               loss_agg_mode: str, global_normalizer: Tensor | float | None,
               max_response_length: int | None, loss_scale_factor: float | None) -> Tensor:
    if token_weights is not None:
        per_token_loss = per_token_loss * token_weights.detach()
    return aggregate_loss(per_token_loss, response_mask, loss_agg_mode, global_normalizer=global_normalizer,
                          max_response_length=max_response_length, loss_scale_factor=loss_scale_factor)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_ratio_low: float,
                       clip_ratio_high: float) -> tuple[Tensor, Tensor]:
    # (B, T) -> per-token loss max(-A r, -A clip(r)), and where the clipped branch was taken.
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _check_clip_range(clip_ratio_low: float, clip_ratio_high: float) -> None:
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(
            f"clip ratios must be >= 0; got clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high}"
        )


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_dual: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    global_normalizer: Tensor | float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with clip-higher and dual clip.  # 4 x (B, T) -> PolicyLossOutput

    `clip_ratio_dual` (c > 1, verl's `clip_ratio_c`) caps the loss of a negative-advantage token at
    -A * c, so a huge ratio cannot push one token arbitrarily far; None turns the dual clip off.
    """
    _check_inputs(logprobs, old_logprobs, advantages, response_mask, token_weights)
    _check_clip_range(clip_ratio_low, clip_ratio_high)
    log_ratio = clamped_log_ratio(logprobs, old_logprobs)
    per_token, clip_taken = _clipped_surrogate(torch.exp(log_ratio), advantages, clip_ratio_low, clip_ratio_high)
    dual_taken = torch.zeros_like(clip_taken)
    if clip_ratio_dual is not None:
        if clip_ratio_dual <= 1.0:
            raise ValueError(f"clip_ratio_dual must be > 1 (or None to disable the dual clip); got {clip_ratio_dual}")
        cap = -advantages * clip_ratio_dual
        dual_taken = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual_taken, cap, per_token)
    loss = _aggregate(per_token, response_mask, token_weights, loss_agg_mode, global_normalizer, max_response_length,
                      loss_scale_factor)
    return PolicyLossOutput(loss, _fraction(clip_taken, response_mask), _fraction(dual_taken, response_mask),
                            *_kl_metrics(log_ratio, response_mask))


def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_normalizer: Tensor | float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """GSPO, token-level form: sequence ratio s_i = exp(mean_t log r_it), clipped.  # 4 x (B, T) -> out"""
    _check_inputs(logprobs, old_logprobs, advantages, response_mask, token_weights)
    _check_clip_range(clip_ratio_low, clip_ratio_high)
    token_log_ratio = logprobs - old_logprobs
    sequence_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1)  # (B,)
    # Value log s_i at every token, gradient that of log pi_t only.
    mixed = sequence_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    ratio = torch.exp(mixed.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    per_token, clip_taken = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    loss = _aggregate(per_token, response_mask, token_weights, loss_agg_mode, global_normalizer, max_response_length,
                      loss_scale_factor)
    no_dual = torch.zeros_like(clip_taken)
    return PolicyLossOutput(loss, _fraction(clip_taken, response_mask), _fraction(no_dual, response_mask),
                            *_kl_metrics(clamped_log_ratio(logprobs, old_logprobs), response_mask))


def cispo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    global_normalizer: Tensor | float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """CISPO: -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi.  # 4 x (B, T) -> PolicyLossOutput

    Unlike PPO, a clipped token keeps its gradient (scaled by the clipped weight).
    """
    _check_inputs(logprobs, old_logprobs, advantages, response_mask, token_weights)
    _check_clip_range(clip_ratio_low, clip_ratio_high)
    log_ratio = clamped_log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(log_ratio.detach())
    low, high = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    weight = ratio.clamp(low, high)
    per_token = -weight * advantages * logprobs
    loss = _aggregate(per_token, response_mask, token_weights, loss_agg_mode, global_normalizer, max_response_length,
                      loss_scale_factor)
    return PolicyLossOutput(loss, _fraction(ratio > high, response_mask), _fraction(ratio < low, response_mask),
                            *_kl_metrics(log_ratio, response_mask))
