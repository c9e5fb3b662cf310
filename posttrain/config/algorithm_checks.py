"""The config's checks on the algorithm's settings (the advantage estimator, dynamic sampling and the groups it keeps,
guidance, reward normalisation and the overlong penalty, the loss's first-token and KL options), and what they ask of
the estimator's declaration (:func:`advantage_estimator_of`). Each returns problems, never raises; ``validate.py``'s
``validate_config`` runs them with the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posttrain.config.schema import PosttrainConfig
from posttrain.errors import Problem

if TYPE_CHECKING:
    from posttrain.algos.registry import AdvantageEstimator


def advantage_estimator_of(config: PosttrainConfig) -> AdvantageEstimator | None:
    """``algorithm.adv_estimator``'s declaration (what it needs, its options), None for an unknown name
    (the preflight names the valid ones)."""
    from posttrain.algos import ADVANTAGE_ESTIMATORS  # torch: imported when a config is checked, not when it is read

    return ADVANTAGE_ESTIMATORS.get(config.algorithm.adv_estimator)


def critic_enabled(config: PosttrainConfig) -> bool:
    """The critic runs when asked to, or by default when the advantage estimator needs values."""
    if config.critic.enable is None:
        estimator = advantage_estimator_of(config)
        return estimator is not None and estimator.needs_values
    return config.critic.enable


def needs_greedy_baseline(config: PosttrainConfig) -> bool:
    """The advantage estimator subtracts a greedy rollout's score (ReMax): a sync-only phase before learning."""
    estimator = advantage_estimator_of(config)
    return estimator is not None and estimator.needs_greedy_baseline


def groups_needed(config: PosttrainConfig, why: str) -> list[Problem]:
    """``rollout.n`` below 2 refused for a setting that works on groups, ``why`` saying what it does with them."""
    n = config.actor_rollout_ref.rollout.n
    return [Problem("actor_rollout_ref.rollout.n", n, f"{why}: set rollout.n >= 2")] if n < 2 else []


def check_dynamic_sampling(config: PosttrainConfig) -> list[Problem]:
    """DAPO's dynamic sampling keeps the groups whose rewards vary: it needs groups, and a step whose
    batch is the groups it keeps (ReMax's baseline phase scores the step's first prompts)."""
    if not config.algorithm.filter_groups.enable:
        return []
    problems = groups_needed(config, "dynamic sampling (algorithm.filter_groups.enable) compares the samples of each prompt")
    if needs_greedy_baseline(config):
        problems.append(Problem("algorithm.filter_groups.enable", True,
                                f"algorithm.adv_estimator={config.algorithm.adv_estimator}'s greedy baseline is scored for the step's "
                                "first prompts, not for the groups dynamic sampling keeps; use grpo/rloo, or turn dynamic sampling off"))
    return problems


def check_kl_groups(config: PosttrainConfig) -> list[Problem]:
    """``filter_groups.kl_groups`` keeps dropped groups for the KL loss alone, the others' advantages as they were: its needs."""
    dynamic, actor, estimator = config.algorithm.filter_groups, config.actor_rollout_ref.actor, advantage_estimator_of(config)
    unmet = [why for met, why in [
        (dynamic.enable, "keeps some of the groups dynamic sampling drops: set algorithm.filter_groups.enable=true"),
        (actor.use_kl_loss and actor.kl_loss_coef > 0, "keeps groups for the KL loss: set actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef > 0"),
        (estimator is None or estimator.constant_group_zero, f"algorithm.adv_estimator={config.algorithm.adv_estimator} does not take each "
         "group's advantage from its own scores alone, so the groups kept would move the others'; use grpo, drgrpo, rloo or grpo_passk"),
        (config.env.reward_norm != "batch", "keeps groups that env.reward_norm=batch would count in the batch's mean and spread; use group or none"),
        (config.env.filter_groups_quantile == 0, "keeps groups without reward spread, which env.filter_groups_quantile drops again; set that to 0"),
    ] if not met]
    return [Problem("algorithm.filter_groups.kl_groups", dynamic.kl_groups, f"{unmet[0]}, or remove it")] if dynamic.kl_groups and unmet else []


def check_guidance(config: PosttrainConfig) -> list[Problem]:
    """Guidance from the data's reference answers (rollout/guidance.py) replaces a sample in a group with no right
    answer: it needs groups and a batch made by one rollout (not a mixture's pieces). Asynchronous runs refuse it
    (``check_async``); a multi-turn environment is refused by ``check_config`` (cli/preflight.py), which can load it."""
    if not config.algorithm.guidance.enable:
        return []
    problems = groups_needed(config, "guidance (algorithm.guidance.enable) gives the reference to a group of answers with none right")
    if config.mixture:
        problems.append(Problem("algorithm.guidance.enable", True, "a mixture's batch is joined from its sources' pieces, and an episode "
                                "source's pieces have no guided rows to join with a single-turn source's; turn guidance off, or train "
                                "on one dataset"))
    return problems


def check_reward_norm(config: PosttrainConfig) -> list[Problem]:
    """``env.reward_norm`` (episodes' rewards and single-turn rows' alike) against an estimator that needs them raw."""
    norm = config.env.reward_norm
    if needs_greedy_baseline(config) and norm != "none":
        return [Problem("env.reward_norm", norm, f"algorithm.adv_estimator={config.algorithm.adv_estimator} subtracts the greedy "
                        "response's raw reward, so the rewards must stay raw: set env.reward_norm=none")]
    return []


def check_overlong_buffer(config: PosttrainConfig) -> list[Problem]:
    buffer, limit = config.reward_model.overlong_buffer, config.data.max_response_length
    problems = []
    if buffer.enable and not 1 <= buffer.len <= limit:
        problems.append(Problem("reward_model.overlong_buffer.len", buffer.len,
                                f"must be in [1, data.max_response_length={limit}]: the last tokens before the limit where the reward shrinks"))
    if buffer.enable and config.env.reward_norm != "none":
        problems.append(Problem("reward_model.overlong_buffer.enable", True,
                                f"the penalty is in raw reward units, and env.reward_norm={config.env.reward_norm} has normalised the "
                                "rewards before it: set env.reward_norm=none (GRPO normalises per group anyway)"))
    return problems


def check_loss_scale_factor(config: PosttrainConfig) -> list[Problem]:
    """verl's seq-mean-token-sum-norm divisor: a positive constant, and only for that mode."""
    key, actor = "actor_rollout_ref.actor.loss_scale_factor", config.actor_rollout_ref.actor
    factor = actor.loss_scale_factor
    if factor is None:
        return []
    if actor.loss_agg_mode != "seq-mean-token-sum-norm":
        return [Problem(key, factor,
                        f"applies only to actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm (it is "
                        f"{actor.loss_agg_mode}); remove it, or set that mode")]
    if factor < 1:
        return [Problem(key, factor,
                        "must be >= 1, e.g. data.max_response_length for verl's convention, or null for posttrain's")]
    return []


def check_skip_first(config: PosttrainConfig) -> list[Problem]:
    """``actor.policy_loss_skip_first`` must leave a response some tokens for the policy loss."""
    skip, limit = config.actor_rollout_ref.actor.policy_loss_skip_first, config.data.max_response_length
    if skip >= limit > 0:
        return [Problem("actor_rollout_ref.actor.policy_loss_skip_first", skip,
                        f"must be below data.max_response_length={limit}: at {skip} no response token takes the policy loss "
                        "(only the KL loss and the entropy bonus, where set, would train); use a small count (1: the first token)")]
    return []


def check_kl_first(config: PosttrainConfig) -> list[Problem]:
    """``actor.kl_loss_first_tokens`` narrows a KL loss and ``kl_loss_first_token_weight`` weights its first token: both
    need one, and the count must be below the response length."""
    actor, limit = config.actor_rollout_ref.actor, config.data.max_response_length
    key, count = "actor_rollout_ref.actor.kl_loss_first_tokens", actor.kl_loss_first_tokens
    if count > 0 and not actor.use_kl_loss:
        return [Problem(key, count, "applies only with actor_rollout_ref.actor.use_kl_loss=true (it chooses the tokens the KL loss "
                                    "counts); set that, or remove it")]
    weight_key, weight = "actor_rollout_ref.actor.kl_loss_first_token_weight", actor.kl_loss_first_token_weight
    if weight != 1 and not actor.use_kl_loss:
        return [Problem(weight_key, weight, "applies only with actor_rollout_ref.actor.use_kl_loss=true (it weights the KL loss "
                                            "on each response's first token); set that, or remove it")]
    if count >= limit > 0:
        return [Problem(key, count, f"must be below data.max_response_length={limit}: at {count} every response token takes the "
                                    "KL loss, which 0 (the default) already says; use 0, or a small count (1: the first token)")]
    return []
