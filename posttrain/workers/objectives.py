"""The losses the workers hand to the training engine, composed from :mod:`posttrain.algos`.

A loss function takes the engine's forward outputs for one micro-batch, the micro-batch and the
mini-batch's global normaliser, and returns the loss (normalised by that normaliser, so micro-batch
losses add up to the mini-batch loss) and metrics that are means over the micro-batch.

Policy: the configured policy loss (PPO clip / GSPO / CISPO), minus ``entropy_coeff`` × entropy,
plus ``kl_loss_coef`` × KL(π ‖ π_ref) when the KL is a loss rather than a reward penalty (GRPO).
``policy_loss_skip_first`` leaves each response's first N tokens out of the policy loss only;
``kl_loss_first_tokens`` puts the KL loss on each response's first N tokens only; ``kl_loss_first_token_weight``
counts each response's first token that many times in it.
With ``importance_cap`` set (asynchronous training: samples from older weights μ), each token's loss
is weighted by min(π_old / μ, cap) from the rollout's BEHAVIOUR_LOGPROBS while the ratio is still
taken against π_old, the proximal policy: decoupled PPO (:mod:`posttrain.algos.off_policy`). For a
single optimizer step π_old is the update's own forward pass, detached (the weights before it).
Critic: the clipped value loss.
SFT: the negative log-likelihood of the assistant tokens (RESPONSE_MASK), averaged over those tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from posttrain import keys
from posttrain.algos import aggregate_loss, get_kl_estimator, get_policy_loss, masked_mean, value_loss
from posttrain.algos.off_policy import rollout_importance_weights
from posttrain.config.schema import ActorConfig, CriticConfig
from posttrain.engines.training.modeling import ForwardOutputs
from posttrain.protocol import Batch


@dataclass(frozen=True)
class PolicyObjective:
    """What the actor's loss is made of; built once from the actor's config section."""

    loss_name: str
    loss_options: dict
    loss_agg_mode: str
    max_response_length: int
    loss_scale_factor: int | None  # None: posttrain's seq-mean-token-sum-norm; set: verl's (algos.aggregation)
    entropy_coeff: float
    kl_loss_coef: float | None  # None: no KL loss
    kl_loss_type: str
    importance_cap: float | None = None  # None: no behaviour-policy correction
    skip_first: int = 0  # each response's first N tokens take no policy loss (KL and entropy still count them)
    kl_first: int = 0  # 0: the KL loss on every response token; N: on each response's first N tokens only
    kl_first_weight: float = 1.0  # the KL loss's weight on each response's first token (a later token's: 1)

    @classmethod
    def from_config(cls, actor: ActorConfig, max_response_length: int, importance_cap: float | None = None) -> PolicyObjective:
        options = {
            "clip_ratio_low": actor.clip_ratio_low,
            "clip_ratio_high": actor.clip_ratio_high,
            "loss_agg_mode": actor.loss_agg_mode,
            "max_response_length": max_response_length,
            "loss_scale_factor": actor.loss_scale_factor,
        }
        if actor.policy_loss in ("vanilla", "ppo"):
            options["clip_ratio_dual"] = actor.clip_ratio_c
        get_policy_loss(actor.policy_loss, **options)  # unknown names and options fail here, at start-up
        if actor.use_kl_loss:
            get_kl_estimator(actor.kl_loss_type)
        return cls(
            actor.policy_loss, options, actor.loss_agg_mode, max_response_length, actor.loss_scale_factor, actor.entropy_coeff,
            actor.kl_loss_coef if actor.use_kl_loss else None, actor.kl_loss_type, importance_cap, actor.policy_loss_skip_first,
            actor.kl_loss_first_tokens, actor.kl_loss_first_token_weight,
        )

    def rows_without_gradient(self, batch: Batch) -> Tensor | None:
        """Rows whose advantage is exactly 0 at every response token (bool (B,)), or None.

        Every policy loss here is the advantage times a function of the ratio, so such a row's loss
        and gradient are exactly 0 — unless an entropy bonus or a KL loss adds terms of their own
        (then None: every row has a gradient). Under GRPO these are the groups whose samples all
        scored the same."""
        if self.entropy_coeff or self.kl_loss_coef is not None:
            return None
        nonzero = (batch[keys.ADVANTAGES] != 0) & batch[keys.RESPONSE_MASK].bool()
        return ~nonzero.any(dim=1)

    def __call__(self, outputs: ForwardOutputs, batch: Batch, normalizer: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch[keys.RESPONSE_MASK]
        policy_loss = get_policy_loss(self.loss_name, **self.loss_options)
        # without OLD_LOGPROBS the update is a single step from the weights that sampled: π_old = π_θ, detached
        old = batch[keys.OLD_LOGPROBS] if keys.OLD_LOGPROBS in batch else outputs.logprobs.detach()
        weighting, metrics = self._behaviour_weights(old, batch)
        scored = after_first_tokens(mask, self.skip_first)
        result = policy_loss(outputs.logprobs, old, batch[keys.ADVANTAGES], scored, global_normalizer=normalizer, **weighting)
        loss = result.loss
        local = policy_loss(outputs.logprobs, old, batch[keys.ADVANTAGES], scored, **weighting).loss.detach()
        metrics |= {
            "pg_loss": local,
            "pg_clipfrac": result.clipfrac,
            "pg_clipfrac_lower": result.clipfrac_lower,
            "ppo_kl": result.ppo_kl,
            "ppo_kl_k3": result.ppo_kl_k3,
        }
        if outputs.entropy is not None:
            metrics["entropy"] = masked_mean(outputs.entropy, mask).detach()
            if self.entropy_coeff:
                loss = loss - self.entropy_coeff * self._aggregate(outputs.entropy, mask, normalizer)
        if self.kl_loss_coef is not None:
            kl = get_kl_estimator(self.kl_loss_type)(outputs.logprobs, batch[keys.REF_LOGPROBS])
            anchored = first_tokens(mask, self.kl_first) if self.kl_first else mask
            first = first_tokens(mask, 1)
            weights = anchored + (self.kl_first_weight - 1) * first  # the first token's weight: kl_first_weight
            # zeroed outside the anchored tokens but aggregated over the whole mask: each row's and token's weight
            # as with the KL on every token, in every loss_agg_mode (seq-mean-token-mean divides by the row's length)
            loss = loss + self.kl_loss_coef * self._aggregate(kl * weights, mask, normalizer)
            metrics["kl_loss"] = masked_mean(kl, anchored).detach()
            metrics["kl_first_token"] = masked_mean(kl, first).detach()
        return loss, metrics

    def _behaviour_weights(self, old: Tensor, batch: Batch) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``token_weights`` min(π_old / μ, cap) and their metrics, when the objective corrects for μ."""
        if self.importance_cap is None:
            return {}, {}
        weights = rollout_importance_weights(old, batch[keys.BEHAVIOUR_LOGPROBS], batch[keys.RESPONSE_MASK], upper=self.importance_cap)
        return {"token_weights": weights.weights}, {
            "behaviour_weight_mean": weights.mean_raw_weight, "behaviour_weight_truncated": weights.truncated_fraction,
        }

    def _aggregate(self, per_token: Tensor, mask: Tensor, normalizer: Tensor) -> Tensor:
        return aggregate_loss(
            per_token, mask, self.loss_agg_mode, global_normalizer=normalizer, max_response_length=self.max_response_length,
            loss_scale_factor=self.loss_scale_factor,
        )


def after_first_tokens(mask: Tensor, skip: int) -> Tensor:
    """``mask`` less each row's first ``skip`` response tokens (its first ``skip`` positions where the mask is set; an
    agent episode's later turns keep theirs)."""
    if skip == 0:
        return mask
    return mask * (mask.cumsum(dim=-1) > skip).to(mask.dtype)


def first_tokens(mask: Tensor, count: int) -> Tensor:
    """Each row's first ``count`` response tokens of ``mask``: what :func:`after_first_tokens` leaves out."""
    return mask - after_first_tokens(mask, count)


@dataclass(frozen=True)
class ValueObjective:
    clip_range: float
    loss_agg_mode: str
    max_response_length: int

    @classmethod
    def from_config(cls, critic: CriticConfig, loss_agg_mode: str, max_response_length: int) -> ValueObjective:
        return cls(critic.cliprange_value, loss_agg_mode, max_response_length)

    def __call__(self, outputs: ForwardOutputs, batch: Batch, normalizer: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch[keys.RESPONSE_MASK]
        common = {"clip_range": self.clip_range, "loss_agg_mode": self.loss_agg_mode, "max_response_length": self.max_response_length}
        result = value_loss(outputs.values, batch[keys.VALUES], batch[keys.RETURNS], mask, global_normalizer=normalizer, **common)
        local = value_loss(outputs.values, batch[keys.VALUES], batch[keys.RETURNS], mask, **common)
        return result.loss, {"vf_loss": local.loss.detach(), "vf_clipfrac": result.clipfrac, "vpred_mean": masked_mean(outputs.values, mask).detach()}


def sft_objective(outputs: ForwardOutputs, batch: Batch, normalizer: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Supervised fine-tuning: mean negative log-likelihood over the mini-batch's assistant tokens."""
    mask = batch[keys.RESPONSE_MASK]
    loss = aggregate_loss(-outputs.logprobs, mask, "token-mean", global_normalizer=normalizer)
    return loss, {"nll": masked_mean(-outputs.logprobs, mask).detach()}
