"""Off-policy correction: importance weights between the trainer's policy and the rollout engine's.

The rollout engine (vLLM, another precision, stale weights in asynchronous training) samples from a
behaviour policy mu that differs from the policy pi_old the trainer recomputes logprobs with. The
policy losses use pi_old; these weights, passed as a loss's `token_weights`, correct for sampling
from mu instead:

    w_t = pi_old(y_t) / mu(y_t)                     level "token"
    w_t = prod_t' pi_old(y_t') / mu(y_t')           level "sequence" (same weight for every token)
    w_t = exp(mean_t' log pi_old(y_t') / mu(y_t'))  level "geometric" (per-token-normalised sequence)

and then, by `mode`:

    "truncate"  min(w, upper)            truncated importance sampling, TIS (Yao et al. 2025,
                                         "Your efficient RL framework secretly brings you off-policy RL training";
                                         Espeholt et al. 2018, IMPALA, for the truncation)
    "mask"      w if lower <= w <= upper, else 0   (importance weight, out-of-range tokens dropped)
    "reject"    1 if lower <= w <= upper, else 0   (rejection only, no reweighting)

At sequence and geometric level a sequence is kept or dropped as a whole. `lower` defaults to
1 / upper; it has no meaning for "truncate" (passing it is an error). `upper=None` under "truncate"
gives the plain, untruncated weights. Weights are detached (no gradient) and 0 at masked positions.

Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization"; used for
asynchronous training by AReaL, Fu et al. 2025): the clip is taken around a proximal policy
pi_prox (the trainer's recomputed logprobs before this update) while the behaviour policy that
sampled the data enters only through the weight pi_prox / mu:

    loss_t = (pi_prox / mu) * max(-A r, -A clip(r)),   r = pi / pi_prox

`decoupled_ppo_policy_loss` composes exactly that from `ppo_policy_loss` and these weights.
Log-ratios are clamped to [-20, 20] (after summing, at sequence level) so that weights stay finite.

`logprob_gap` measures how far pi_old is from mu at all: |log pi_old - log mu| per valid token, its mean and
max. Engines that agree differ by rounding only; a chat template, a tokenisation or a sampling transform
(temperature, top-k, top-p) applied on one side only shows here before it shows in learning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.algos.policy_loss import LOG_RATIO_LIMIT, PolicyLossOutput, ppo_policy_loss
from posttrain.algos.utils import check_same_shape, masked_mean, masked_sum

__all__ = ["IMPORTANCE_LEVELS", "IMPORTANCE_MODES", "ImportanceWeights", "LogprobGap", "rollout_importance_weights",
           "decoupled_ppo_policy_loss", "logprob_gap"]

IMPORTANCE_LEVELS = ("token", "sequence", "geometric")
IMPORTANCE_MODES = ("truncate", "mask", "reject")


@dataclass(frozen=True)
class ImportanceWeights:
    weights: Tensor  # (B, T) detached; 0 at masked positions and dropped tokens
    kept_fraction: Tensor  # () share of valid tokens not dropped ("mask", "reject"; 1 for "truncate")
    truncated_fraction: Tensor  # () share of valid tokens whose weight was capped ("truncate")
    mean_raw_weight: Tensor  # () masked mean of the weights before truncation or masking


def _log_weights(old_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor, level: str) -> Tensor:
    # (B, T) -> (B, T) log importance weight of each token at the requested level.
    log_weights = old_logprobs.detach() - behaviour_logprobs.detach()
    if level == "sequence":
        log_weights = masked_sum(log_weights, response_mask, dim=-1).unsqueeze(-1).expand_as(log_weights)
    elif level == "geometric":
        log_weights = masked_mean(log_weights, response_mask, dim=-1).unsqueeze(-1).expand_as(log_weights)
    return log_weights.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _check_options(level: str, mode: str, upper: float | None, lower: float | None) -> tuple[float | None, float]:
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"unknown importance level {level!r}; valid levels: {', '.join(IMPORTANCE_LEVELS)}")
    if mode not in IMPORTANCE_MODES:
        raise ValueError(f"unknown importance mode {mode!r}; valid modes: {', '.join(IMPORTANCE_MODES)}")
    if mode == "truncate":
        if lower is not None:
            raise ValueError("lower applies only to mode 'mask' or 'reject'; 'truncate' caps from above only")
        return upper, 0.0
    if upper is None or upper <= 0:
        raise ValueError(f"mode {mode!r} needs an interval: upper > 0; got upper={upper}")
    lower = 1.0 / upper if lower is None else lower
    if not 0 <= lower <= upper:
        raise ValueError(f"need 0 <= lower <= upper; got lower={lower}, upper={upper}")
    return upper, lower


@dataclass(frozen=True)
class LogprobGap:
    mean: float  # mean |log pi_old - log mu| over the valid tokens
    max: float  # the largest
    tokens: int  # how many valid tokens


def logprob_gap(old_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor) -> LogprobGap | None:
    """|log pi_old - log mu| over the valid tokens: mean, max and count; None with no valid token.  # 3 x (B, T)"""
    check_same_shape(old_logprobs=old_logprobs, behaviour_logprobs=behaviour_logprobs, response_mask=response_mask)
    valid = response_mask != 0
    if not valid.any():
        return None
    gap = (old_logprobs.float() - behaviour_logprobs.float()).abs()[valid]
    return LogprobGap(float(gap.mean()), float(gap.max()), int(valid.sum()))


def rollout_importance_weights(
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    upper: float | None = 2.0,
    lower: float | None = None,
) -> ImportanceWeights:
    """Importance weights pi_old / mu, truncated or masked.  # 3 x (B, T) -> ImportanceWeights"""
    check_same_shape(old_logprobs=old_logprobs, behaviour_logprobs=behaviour_logprobs, response_mask=response_mask)
    upper, lower = _check_options(level, mode, upper, lower)
    raw = torch.exp(_log_weights(old_logprobs, behaviour_logprobs, response_mask, level))
    valid = response_mask != 0
    truncated = torch.zeros_like(valid)
    kept = torch.ones_like(valid)
    if mode == "truncate":
        weights = raw if upper is None else raw.clamp(max=upper)
        truncated = raw > weights
    else:
        kept = (raw >= lower) & (raw <= upper)
        inside = raw if mode == "mask" else torch.ones_like(raw)
        weights = torch.where(kept, inside, torch.zeros_like(raw))
    weights = torch.where(valid, weights, torch.zeros_like(weights))
    return ImportanceWeights(weights, masked_mean(kept.float(), response_mask),
                             masked_mean(truncated.float(), response_mask), masked_mean(raw, response_mask))


def decoupled_ppo_policy_loss(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    behaviour_weight_cap: float | None = None,
    token_weights: Tensor | None = None,
    **ppo_options: Any,
) -> PolicyLossOutput:
    """Decoupled PPO: clip around pi_prox, weight by pi_prox / mu.  # 5 x (B, T) -> PolicyLossOutput

    `behaviour_weight_cap` truncates pi_prox / mu (None: untruncated); `token_weights` multiplies
    further; `ppo_options` go to `ppo_policy_loss` (clip ratios, aggregation).
    """
    check_same_shape(proximal_logprobs=proximal_logprobs, behaviour_logprobs=behaviour_logprobs,
                     response_mask=response_mask)
    weights = rollout_importance_weights(proximal_logprobs, behaviour_logprobs, response_mask,
                                         level="token", mode="truncate", upper=behaviour_weight_cap).weights
    if token_weights is not None:
        weights = weights * token_weights
    return ppo_policy_loss(logprobs, proximal_logprobs, advantages, response_mask, token_weights=weights, **ppo_options)
