"""What is decided across a whole training batch of rollouts: dropping low-spread groups and
normalising rewards (``env.filter_groups_quantile``, ``env.reward_norm``), and DAPO's dynamic
sampling (``algorithm.filter_groups``: :func:`dynamic_sample`), which generates more rounds until
the batch holds enough groups whose rewards vary.

An asynchronous batch arrives in units; these run once the units are joined.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from posttrain import keys
from posttrain.algos import first_rows, groups_with_spread, normalize_episode_rewards, rows_of_varied_groups
from posttrain.config.schema import PosttrainConfig
from posttrain.config.algorithm_checks import critic_enabled
from posttrain.protocol import Batch
from posttrain.metrics import Metrics, mean, merge, total
from posttrain.rollout.batching import group_ids_of, join_rollouts


def final_token_positions(batch: Batch) -> torch.Tensor:
    """(B,) index of each row's last loss-carrying token (the final agent token); 0 for none."""
    mask = batch[keys.RESPONSE_MASK].bool()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask, positions, torch.zeros_like(positions)).max(dim=1).values


def episode_index(batch: Batch) -> torch.Tensor:
    """(B,) each row's episode as 0..E-1, from EPISODE_IDS (an episode may give several samples)."""
    _, inverse = np.unique(np.asarray(batch[keys.EPISODE_IDS], dtype=str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def fill_episode_batch(batch: Batch, ranks: int) -> Batch:
    """A batch whose groups vary in samples (EPISODE_IDS), made ready for the update: its group count in
    meta (GROUP_COUNT: the optimizer steps follow the groups, not the samples), and rows that carry no
    loss (copies of its last row with RESPONSE_MASK 0, in that row's episode) added up to a multiple of
    ``ranks``, so each rank gets an equal share and no sample is trained twice (the dispatch's own
    padding copies rows as they are)."""
    missing = -len(batch) % ranks
    if missing:
        filler = batch.index(torch.full((missing,), len(batch) - 1, dtype=torch.long)).copy()
        filler.tensors[keys.RESPONSE_MASK] = torch.zeros_like(filler[keys.RESPONSE_MASK])
        batch = Batch.concat([batch, filler])
    out = Batch(batch.tensors, batch.non_tensors, dict(batch.meta))
    out.meta[keys.GROUP_COUNT] = int(torch.unique(batch[keys.GROUP_IDS]).numel()) if keys.GROUP_IDS in batch else 1
    return out


def normalize_rewards(batch: Batch, mode: str) -> Batch:
    """Episode rewards normalised by group, batch or not at all; the change lands on the final agent token.
    Where an episode gave several samples (EPISODE_IDS), each episode counts once and all its samples move."""
    if mode == "none":
        return batch
    scores = batch[keys.TOKEN_SCORES].clone()
    episode = scores.sum(-1)
    group_ids = batch[keys.GROUP_IDS] if keys.GROUP_IDS in batch else None
    if keys.EPISODE_IDS in batch:
        index = episode_index(batch)
        first = first_rows(index)
        episode = episode[first][index]
        normalized = normalize_episode_rewards(episode[first], mode, None if group_ids is None else group_ids[first])[index]
    else:
        normalized = normalize_episode_rewards(episode, mode, group_ids)
    scores[torch.arange(len(batch)), final_token_positions(batch)] += normalized - episode
    out = batch.copy()
    out.tensors[keys.TOKEN_SCORES] = scores
    return out


@dataclass(frozen=True)
class UpdateBatchShape:
    """What a filtered batch must still split into: whole mini-batches (in groups) and ranks."""

    groups_per_mini_batch: int  # the least common multiple of the actor's (and critic's) mini-batch sizes
    group_size: int             # rollout.n
    ranks: int


def update_batch_shape(config: PosttrainConfig) -> UpdateBatchShape:
    sizes = [config.actor_rollout_ref.actor.ppo_mini_batch_size]
    if critic_enabled(config):
        sizes.append(config.critic.ppo_mini_batch_size)
    ranks = config.trainer.nnodes * config.trainer.n_workers_per_node
    return UpdateBatchShape(math.lcm(*sizes), config.actor_rollout_ref.rollout.n, ranks)


def kept_group_count(groups: int, shape: UpdateBatchShape) -> int:
    """The most of ``groups`` that still split evenly: a multiple of a mini-batch, or (fewer than
    one mini-batch) a count whose samples divide over the ranks; 0 when none does."""
    if groups >= shape.groups_per_mini_batch:
        return groups - groups % shape.groups_per_mini_batch
    return most_over_ranks(groups, 0, shape)


def most_over_ranks(groups: int, after: int, shape: UpdateBatchShape) -> int:
    """The most of ``groups`` (whole groups of ``rollout.n``) that, after ``after`` such groups, leave a
    number of samples that divides over the ranks; 0 when none does."""
    while groups and ((after + groups) * shape.group_size) % shape.ranks:
        groups -= 1
    return groups


def filter_groups(batch: Batch, quantile: float, shape: UpdateBatchShape, metrics: Metrics) -> tuple[Batch, Metrics]:
    """Drop the groups whose reward spread is below ``quantile`` of the batch's (0: keep all).

    The kept groups are then trimmed, lowest spread first, to a count the update can split
    (:func:`kept_group_count`); if no count works, the whole batch is kept.
    """
    if quantile == 0.0:
        return batch, metrics
    rewards, group_ids = batch[keys.TOKEN_SCORES].sum(-1), batch[keys.GROUP_IDS]
    if keys.EPISODE_IDS in batch:  # an episode of several samples counts once in its group's spread
        first = first_rows(episode_index(batch))
        rewards, spread_ids = rewards[first], group_ids[first]
    else:
        spread_ids = group_ids
    keep = groups_with_spread(rewards, spread_ids, quantile)
    kept = sorted({int(g) for g in spread_ids[keep]}, key=lambda g: -rewards[spread_ids == g].std(unbiased=False).item())
    kept = kept[: kept_group_count(len(kept), shape)]
    if not kept:
        return batch, metrics | {"agent/groups_kept_ratio": mean(1.0, len(batch))}
    keep = torch.isin(group_ids, torch.tensor(kept, dtype=group_ids.dtype))
    metrics = metrics | {"agent/groups_kept_ratio": mean(keep.float().mean().item(), len(batch))}
    return batch.index(torch.nonzero(keep).squeeze(1)), metrics


Round = tuple[Batch, Metrics]  # a scored rollout and its metrics


class FlatGroups:
    """The best-scored ``limit`` of the groups dynamic sampling drops (mean reward, then the order seen),
    for ``algorithm.filter_groups.kl_groups``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.seen = limit, 0
        self.best: list[tuple[float, int, Batch, torch.Tensor]] = []  # (-mean reward, order, round, its rows)

    def add(self, batch: Batch, rewards: torch.Tensor, ids: torch.Tensor, flat: torch.Tensor) -> None:
        for group in sorted(set(ids[flat].tolist())):
            rows = torch.nonzero(ids == group).squeeze(1)
            self.best.append((-rewards[rows].mean().item(), self.seen, batch, rows))
            self.seen += 1
        self.best = sorted(self.best, key=lambda entry: entry[:2])[: self.limit]

    def after(self, batch: Batch, shape: UpdateBatchShape, pad_token_id: int) -> tuple[Batch, int]:
        """``batch`` (its groups varied) and as many of these as the ranks allow after it, marked KL_ONLY."""
        extra = len(self.best)
        if keys.EPISODE_IDS not in batch:  # a program's batch is filled to the ranks by fill_episode_batch instead
            extra = most_over_ranks(extra, len(set(batch[keys.UID])), shape)
        pieces = [batch, *(round_batch.index(rows) for _, _, round_batch, rows in self.best[:extra])]
        for index, piece in enumerate(pieces):
            piece.tensors[keys.KL_ONLY] = torch.full((len(piece),), index > 0)
        return (join_rollouts(pieces, pad_token_id) if extra else batch), extra


def dynamic_sample(first: Round, more: Callable[[], Round | None], groups: int, max_rounds: int, shape: UpdateBatchShape,
                   pad_token_id: int, kl_groups: int = 0) -> Round:
    """DAPO's dynamic sampling. From ``first`` and as many rounds of ``more()`` as it takes (at most
    ``max_rounds`` in all; ``more`` returns None when the data runs out), keep the groups whose
    rewards are not all equal, in order, until ``groups`` are kept; the batch is those groups (past
    ``max_rounds``, the ones kept, trimmed to a count the update can split: :func:`kept_group_count`;
    none at all: ``first`` as it was, which teaches nothing under group advantages).

    ``kl_groups``: up to that many of the dropped groups follow them (:class:`FlatGroups`), trimmed so
    the samples still divide over the ranks, marked KL_ONLY (advantage 0: only the KL loss, and an
    entropy bonus, learns from them). The batch then says its groups (meta GROUP_COUNT) and those
    (KL_GROUP_COUNT), and the update makes as many optimizer steps as without them.

    Metrics: the rounds' own, merged (each by its kind), and ``dynamic_sampling/rounds``,
    ``dynamic_sampling/dropped_groups`` (no reward spread), ``dynamic_sampling/kept_groups``,
    ``dynamic_sampling/kl_groups`` (with ``kl_groups``)."""
    kept: list[Batch] = []
    flat = FlatGroups(kl_groups)
    kept_groups = dropped = rounds = 0
    round_metrics: list[Metrics] = []
    current: Round | None = first
    while current is not None:
        batch, metrics = current
        rounds += 1
        round_metrics.append(metrics)
        ids = group_ids_of(batch[keys.UID])
        rewards = batch[keys.TOKEN_SCORES].sum(-1)
        varied = rows_of_varied_groups(rewards, ids)
        dropped += len(set(ids[~varied].tolist()))
        if kl_groups:
            flat.add(batch, rewards, ids, ~varied)
        if varied.any():
            kept.append(batch.index(torch.nonzero(varied).squeeze(1)))
            kept_groups += len(set(ids[varied].tolist()))
        if kept_groups >= groups or rounds >= max_rounds:
            break
        current = more()
    metrics = merge(round_metrics) | {"dynamic_sampling/rounds": total(rounds), "dynamic_sampling/dropped_groups": total(dropped)}
    target = groups if kept_groups >= groups else kept_group_count(kept_groups, shape)
    if target == 0:
        none = {"dynamic_sampling/kept_groups": total(0)} | ({"dynamic_sampling/kl_groups": total(0)} if kl_groups else {})
        return first[0], metrics | none
    joined = join_rollouts(kept, pad_token_id) if len(kept) > 1 else kept[0]
    ids = group_ids_of(joined[keys.UID])
    batch = joined.index(torch.nonzero(ids < target).squeeze(1))
    metrics |= {"dynamic_sampling/kept_groups": total(target)}
    extra = 0
    if kl_groups:
        batch, extra = flat.after(batch, shape, pad_token_id)
        metrics |= {"dynamic_sampling/kl_groups": total(extra)}
    batch.tensors[keys.GROUP_IDS] = group_ids_of(batch[keys.UID])
    batch.meta.update(first[0].meta)
    if extra:
        batch.meta[keys.GROUP_COUNT], batch.meta[keys.KL_GROUP_COUNT] = target + extra, extra
    return batch, metrics
