"""Episode reward normalisation for multi-turn training, selected by name.

One reward per episode (B,) (the sum of a multi-turn episode's rewards, say), normalised before it
is placed on the episode's last token:

| mode  | result                                                    |
|-------|-----------------------------------------------------------|
| group | (r - group mean) / (group std + eps)  (GRPO-style, per prompt) |
| batch | (r - batch mean) / (batch std + eps)                      |
| none  | r                                                         |

Standard deviations are Bessel-corrected. A group (or batch) of one, or one whose rewards are all
equal, normalises to exactly 0. `scale_by_std=False` only centres. NaN or inf rewards raise
ValueError naming the sample index.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algos.groups import group_normalize
from posttrain.algos.utils import check_finite

__all__ = ["REWARD_NORM_MODES", "normalize_episode_rewards"]

REWARD_NORM_MODES = ("group", "batch", "none")


def normalize_episode_rewards(
    rewards: Tensor,
    mode: str,
    group_ids: Tensor | None = None,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> Tensor:
    """Normalise episode rewards within groups, the batch, or not at all.  # (B,), (B,) -> (B,)"""
    if mode not in REWARD_NORM_MODES:
        raise ValueError(f"unknown reward normalisation {mode!r}; valid modes: {', '.join(REWARD_NORM_MODES)}")
    if rewards.dim() != 1:
        raise ValueError(f"episode rewards must be (B,), one per episode; got shape {tuple(rewards.shape)}")
    check_finite("episode rewards", rewards)
    if not rewards.dtype.is_floating_point:
        rewards = rewards.float()
    if mode == "none":
        return rewards
    if mode == "batch":
        group_ids = torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device)
    elif group_ids is None:
        raise ValueError("reward normalisation 'group' needs group_ids (B,), the prompt id of each episode")
    return group_normalize(rewards, group_ids, eps=eps, scale_by_std=scale_by_std)
