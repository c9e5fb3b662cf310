"""RL math for post-training: pure functions over tensors (torch and numpy only; no config, no I/O).

| module          | what |
|-----------------|------|
| `utils`         | masked sum / mean / variance / whitening; shape, finiteness and group-id checks |
| `logits`        | chunked logprob-of-label and entropy from logits (bounded memory, custom backward) |
| `groups`        | per-group statistics of per-sequence scores |
| `advantages`    | GAE, GRPO, Dr.GRPO, RLOO, REINFORCE++(-baseline), ReMax, GRPO pass@k |
| `aggregation`   | loss aggregation modes with a global normaliser (micro-batch invariant) |
| `policy_loss`   | PPO (clip-higher, dual clip), GSPO, CISPO |
| `off_policy`    | rollout importance weights (truncate / mask / reject; token / sequence / geometric), decoupled PPO |
| `value_loss`    | clipped value loss, explained variance |
| `kl`            | KL estimators k1 / abs / k2 / k3 / k3+, reward penalty, fixed and adaptive controllers |
| `reward_norm`   | episode reward normalisation: group / batch / none |
| `shaping`       | DAPO's overlong penalty; the rows of groups whose rewards vary (dynamic sampling) |
| `registry`      | name -> function registries and `get_*` helpers |

Shapes: B sequences, T response positions, V vocabulary. See README.md for one-line formulas.
"""

from posttrain.algos.advantages import (
    AdvantageInputs,
    AdvantageOutput,
    discounted_returns,
    drgrpo_advantages,
    first_rows,
    gae_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    per_episode,
    remax_advantages,
    rloo_advantages,
    sequence_scores,
)
from posttrain.algos.aggregation import LOSS_AGG_MODES, aggregate_loss, loss_normalizer
from posttrain.algos.groups import GroupStats, group_best_gap, group_normalize, group_stats
from posttrain.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLPenaltyOutput,
    apply_kl_penalty,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_k3_straight_through,
    kl_penalty,
)
from posttrain.algos.logits import entropy_from_logits, head_logprobs, logprobs_from_logits
from posttrain.algos.off_policy import (
    IMPORTANCE_LEVELS,
    IMPORTANCE_MODES,
    ImportanceWeights,
    LogprobGap,
    decoupled_ppo_policy_loss,
    logprob_gap,
    rollout_importance_weights,
)
from posttrain.algos.policy_loss import (
    PolicyLossOutput,
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
)
from posttrain.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageEstimator,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
)
from posttrain.algos.reward_norm import REWARD_NORM_MODES, groups_with_spread, normalize_episode_rewards
from posttrain.algos.shaping import overlong_penalty, rows_of_varied_groups
from posttrain.algos.utils import masked_mean, masked_sum, masked_var, masked_whiten
from posttrain.algos.value_loss import ValueLossOutput, explained_variance, value_loss

__all__ = [
    "overlong_penalty",
    "rows_of_varied_groups",
    "ADVANTAGE_ESTIMATORS",
    "IMPORTANCE_LEVELS",
    "IMPORTANCE_MODES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "REWARD_NORM_MODES",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "first_rows",
    "per_episode",
    "AdvantageOutput",
    "FixedKLController",
    "GroupStats",
    "ImportanceWeights",
    "KLPenaltyOutput",
    "LogprobGap",
    "PolicyLossOutput",
    "ValueLossOutput",
    "aggregate_loss",
    "apply_kl_penalty",
    "cispo_policy_loss",
    "decoupled_ppo_policy_loss",
    "discounted_returns",
    "drgrpo_advantages",
    "entropy_from_logits",
    "head_logprobs",
    "explained_variance",
    "gae_advantages",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_policy_loss",
    "group_best_gap",
    "group_normalize",
    "group_stats",
    "grpo_advantages",
    "grpo_passk_advantages",
    "gspo_policy_loss",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_k3_straight_through",
    "kl_penalty",
    "logprob_gap",
    "logprobs_from_logits",
    "loss_normalizer",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "groups_with_spread",
    "normalize_episode_rewards",
    "ppo_policy_loss",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "rollout_importance_weights",
    "sequence_scores",
    "value_loss",
]
