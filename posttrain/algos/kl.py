"""KL between the policy and a reference policy: per-token estimators, reward penalty, controllers.

Per-token estimators of KL(pi || pi_ref) from tokens sampled from pi, with x = log pi - log pi_ref
(Schulman 2020, "Approximating KL divergence"); names are verl's `kl_penalty` values:

| name             | value                              | note |
|------------------|------------------------------------|------|
| kl, k1           | x                                  | unbiased, high variance, can be negative |
| abs              | abs(x)                             | |
| mse, k2          | x^2 / 2                            | biased, low variance; its gradient is the KL gradient |
| low_var_kl, k3   | exp(-x) - 1 + x, clamped to [-10, 10] | unbiased, non-negative, low variance |
| k3+, low_var_kl+ | value of k3, gradient of k2        | straight-through: k2 + sg(k3 - k2) |

Why k3+: as a loss, k3's gradient (1 - exp(-x)) is not the gradient of the KL for samples of pi,
while k2's (x) is; the straight-through form reports k3's unbiased value and follows k2's
gradient. x is clamped to [-20, 20] before exp so an extreme ratio gives a finite value and gradient
instead of inf and NaN (k3's clamp at 10 would otherwise meet an inf).

`apply_kl_penalty` subtracts beta * KL per token from token-level rewards (the in-reward penalty of
Ziegler et al. 2019 and InstructGPT). Controllers hold beta between steps:
`FixedKLController` never changes it; `AdaptiveKLController` follows Ziegler et al. 2019:
    e = clip(KL / KL_target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algos.utils import check_same_shape, masked_mean

__all__ = [
    "kl_k1",
    "kl_abs",
    "kl_k2",
    "kl_k3",
    "kl_k3_straight_through",
    "KL_ESTIMATORS",
    "kl_penalty",
    "KLPenaltyOutput",
    "apply_kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
]

_LOG_RATIO_LIMIT = 20.0
_K3_LIMIT = 10.0


def _log_ratio(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return logprobs - ref_logprobs


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """log pi - log pi_ref.  # (B, T), (B, T) -> (B, T)"""
    return _log_ratio(logprobs, ref_logprobs)


def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """|log pi - log pi_ref|.  # (B, T), (B, T) -> (B, T)"""
    return _log_ratio(logprobs, ref_logprobs).abs()


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """0.5 * (log pi - log pi_ref)^2.  # (B, T), (B, T) -> (B, T)"""
    return 0.5 * _log_ratio(logprobs, ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """exp(-x) - 1 + x, x = log pi - log pi_ref, clamped to [-10, 10].  # (B, T), (B, T) -> (B, T)"""
    x = _log_ratio(logprobs, ref_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return (torch.expm1(-x) + x).clamp(-_K3_LIMIT, _K3_LIMIT)


def kl_k3_straight_through(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Value of k3, gradient of k2.  # (B, T), (B, T) -> (B, T)"""
    k2 = kl_k2(logprobs, ref_logprobs)
    return k2 + (kl_k3(logprobs, ref_logprobs) - k2).detach()


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "kl": kl_k1,
    "k1": kl_k1,
    "abs": kl_abs,
    "mse": kl_k2,
    "k2": kl_k2,
    "low_var_kl": kl_k3,
    "k3": kl_k3,
    "k3+": kl_k3_straight_through,
    "low_var_kl+": kl_k3_straight_through,
}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate named by `kind` (a key of KL_ESTIMATORS).  # (B, T), (B, T) -> (B, T)"""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid names: {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logprobs, ref_logprobs)


@dataclass(frozen=True)
class KLPenaltyOutput:
    rewards: Tensor  # (B, T) token_rewards - beta * kl, 0 at masked positions
    kl: Tensor  # (B, T) per-token estimate, 0 at masked positions
    mean_kl: Tensor  # () mean over sequences of each sequence's mean KL per token


def apply_kl_penalty(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    response_mask: Tensor,
    *,
    beta: float,
    kind: str = "kl",
) -> KLPenaltyOutput:
    """rewards - beta * KL per token, masked.  # 4 x (B, T) -> KLPenaltyOutput

    `mean_kl` (a sequence's per-token mean, averaged over sequences; empty sequences count as 0)
    is what an adaptive controller is updated with.
    """
    check_same_shape(token_rewards=token_rewards, logprobs=logprobs, ref_logprobs=ref_logprobs,
                     response_mask=response_mask)
    valid = response_mask != 0
    kl = torch.where(valid, kl_penalty(logprobs, ref_logprobs, kind), 0.0)
    rewards = torch.where(valid, token_rewards - beta * kl, 0.0)
    mean_kl = masked_mean(kl, response_mask, dim=-1).mean() if kl.shape[0] else kl.new_zeros(())
    return KLPenaltyOutput(rewards, kl, mean_kl)


class FixedKLController:
    """A constant KL coefficient (the `update` of the adaptive controller, doing nothing)."""

    def __init__(self, coef: float) -> None:
        self.coef = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Leave the coefficient unchanged."""

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])


class AdaptiveKLController(FixedKLController):
    """Proportional controller steering the measured KL towards `target_kl` (Ziegler et al. 2019)."""

    def __init__(self, init_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0; got target_kl={target_kl}, horizon={horizon}")
        super().__init__(init_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
