"""The controller-side phases of a step, as functions over Batches (the math itself is in algos).

Each takes what it needs explicitly; the trainer calls them in the order of the algorithm.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from posttrain import keys
from posttrain.algos import AdaptiveKLController, FixedKLController, apply_kl_penalty
from posttrain.algos.advantages import AdvantageInputs, AdvantageOutput
from posttrain.config.schema import PosttrainConfig
from posttrain.protocol import Batch


def single_update_step(config: PosttrainConfig) -> bool:
    """Whether the actor's update is ONE optimizer step from the weights that sampled (one PPO epoch,
    one mini-batch, no KL penalty in the reward, which reads π_old): then π_old is the update's own
    forward pass, detached, and the separate old-logprob pass can be skipped."""
    actor = config.actor_rollout_ref.actor
    return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size and not config.algorithm.use_kl_in_reward


def repeat_for_groups(batch: Batch, n: int) -> Batch:
    """Each prompt ``n`` times, interleaved (a group stays contiguous), with GROUP_IDS from its UID."""
    repeated = batch.repeat(n, interleave=True)
    return repeated.union(Batch.from_dict({keys.GROUP_IDS: group_ids_of(repeated[keys.UID])}))


def group_ids_of(uids) -> torch.Tensor:
    """(B,) group number of each row: rows with the same prompt UID share one, numbered in order of appearance."""
    index = {uid: i for i, uid in enumerate(dict.fromkeys(list(uids)))}
    return torch.tensor([index[u] for u in uids], dtype=torch.long)


def apply_kl_in_reward(batch: Batch, controller: FixedKLController, kind: str) -> tuple[Batch, dict[str, float]]:
    """TOKEN_REWARDS = TOKEN_SCORES − β·KL(π_old ‖ π_ref) per token; the adaptive β moves toward its target."""
    result = apply_kl_penalty(
        batch[keys.TOKEN_SCORES], batch[keys.OLD_LOGPROBS], batch[keys.REF_LOGPROBS], batch[keys.RESPONSE_MASK],
        beta=controller.coef, kind=kind,
    )
    metrics = {"critic/kl": float(result.mean_kl), "critic/kl_coeff": controller.coef}
    controller.update(float(result.mean_kl), n_steps=len(batch))
    return batch.union(Batch.from_dict({keys.TOKEN_REWARDS: result.rewards})), metrics


def kl_controller(kind: str, coef: float, target_kl: float, horizon: int) -> FixedKLController:
    if kind == "adaptive":
        return AdaptiveKLController(coef, target_kl, horizon)
    return FixedKLController(coef)


def compute_advantages(batch: Batch, estimator: Callable[[AdvantageInputs], AdvantageOutput]) -> Batch:
    """ADVANTAGES and RETURNS by the configured estimator (rewards: TOKEN_REWARDS, else TOKEN_SCORES)."""
    rewards = batch[keys.TOKEN_REWARDS] if keys.TOKEN_REWARDS in batch else batch[keys.TOKEN_SCORES]
    optional = lambda key: batch[key] if key in batch else None  # noqa: E731
    inputs = AdvantageInputs(
        token_rewards=rewards, response_mask=batch[keys.RESPONSE_MASK], group_ids=optional(keys.GROUP_IDS),
        values=optional(keys.VALUES), baseline_scores=optional(keys.BASELINE_SCORES),
    )
    out = estimator(inputs)
    return batch.union(Batch.from_dict({keys.ADVANTAGES: out.advantages, keys.RETURNS: out.returns}))


def validation_metrics(batch: Batch, n: int) -> dict[str, float]:
    """Per data source: ``val/<source>/acc/mean@n`` (mean over all samples) and ``best@n`` (any of a
    prompt's n samples right), and ``maj@n`` when the scores carry predictions (``reward_extra/pred``).

    Accuracy is ``reward_extra/acc`` when the score function reports it, else score > 0.
    """
    scores = batch[keys.TOKEN_SCORES].sum(-1).numpy()
    acc = np.asarray(batch["reward_extra/acc"], dtype=float) if "reward_extra/acc" in batch else (scores > 0).astype(float)
    predictions = batch["reward_extra/pred"] if "reward_extra/pred" in batch else None
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row, (source, uid) in enumerate(zip(batch[keys.DATA_SOURCE], batch[keys.UID])):
        groups[(source, uid)].append(row)
    per_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (source, _), rows in groups.items():
        per_source[source]["mean"].append(float(acc[rows].mean()))
        per_source[source]["best"].append(float(acc[rows].max()))
        per_source[source]["reward"].append(float(scores[rows].mean()))
        if predictions is not None:
            votes = [predictions[r] for r in rows]
            answered = [vote for vote in votes if vote == vote]  # NaN: no answer was extracted, which wins no vote
            winner = max(set(answered), key=answered.count) if answered else None
            majority = [acc[r] for r, vote in zip(rows, votes) if answered and vote == winner]
            per_source[source]["maj"].append(float(np.mean(majority)) if majority else 0.0)
    metrics = {}
    for source, values in per_source.items():
        for name, numbers in values.items():
            label = f"val/{source}/reward/mean@{n}" if name == "reward" else f"val/{source}/acc/{name}@{n}"
            metrics[label] = float(np.mean(numbers))
    return metrics
