"""Advantage estimators: token-level rewards (and values, groups, baselines) -> advantages, returns.

Every estimator returns `AdvantageOutput(advantages, returns)`, both (B, T) like the response and
exactly 0 where `response_mask` is 0. Estimators without a critic set `returns = advantages`
(nothing trains on them; verl does the same), except REINFORCE++ whose returns are the discounted
returns before whitening, and ReMax whose returns are the reward-to-go sum_{t' >= t} r_t' (verl's;
they are what `critic/returns/*` reports, and what a critic would train on).

Outcome-reward estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, ReMax, GRPO pass@k) read
`rewards` as either token-level rewards (B, T), whose masked sum over T is the sequence score, or
the scores themselves (B,). The sequence's advantage is then spread over all its valid tokens.
`group_ids` (B,) is an integer tensor, equal for the responses to one prompt.

Advantage of sequence i (score s_i, group g of size n), by config name:

    gae                            sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t;
                                   whitened over the batch (Schulman et al. 2016, GAE; PPO)
    grpo                           (s_i - mean_g) / (std_g + eps)  (Shao et al. 2024, DeepSeekMath)
    drgrpo                         s_i - mean_g  (Liu et al. 2025, Dr. GRPO)
    rloo                           s_i - mean of the other n - 1 members  (Ahmadian et al. 2024)
    reinforce_plus_plus            whiten_batch(sum_l gamma^l r_{t+l})  (Hu 2025, REINFORCE++)
    reinforce_plus_plus_baseline   whiten_batch(s_i - mean_g)  (Hu 2025)
    remax                          s_i - b_i, b_i the greedy response's score  (Li et al. 2024, ReMax)
    grpo_passk                     best of g: s_best - s_second; others 0  (verl's grpo_passk)

Deviations and edge cases, all deliberate:
- Masked positions inside a response (observation tokens of a multi-turn episode) are skipped by the
  GAE and REINFORCE++ recursions: a step jumps from one valid token to the next valid token, and
  rewards or values at masked positions are ignored. With a contiguous mask this is textbook GAE.
  (verl's REINFORCE++ resets the return at a masked token instead.)
- Standard deviations are Bessel-corrected, as `torch.std` (and verl).
- ReMax's advantage is s_i - b_i at every token, the paper's. verl's is the reward-to-go minus b_i,
  which is the same when the reward sits on the last token only but not when token rewards are
  spread (a KL penalty in the reward).
- A group of one, and a group whose scores are all equal, gets advantage exactly 0 under grpo,
  drgrpo, rloo and grpo_passk. REINFORCE++-baseline then whitens over the batch, which shifts every
  sequence, so there a constant group is 0 only before the whitening (as in the paper).
- Whitening over a batch with fewer than two valid tokens gives 0 (see `masked_whiten`).
- A sequence whose mask is all 0 gets 0 everywhere (never NaN).
- NaN or inf in rewards, scores or baselines raises ValueError naming the sample index.

An episode may give several samples (an agent program whose requests did not extend each other,
rollout/program.py). `per_episode` runs an outcome estimator over episodes, not samples: each episode's
score is its samples' mean (they share the score; a KL or overlong term in the reward is each sample's
own), group statistics count each episode once, and every sample carries its episode's advantage on its
own response tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algos.groups import group_best_gap, group_normalize, group_stats
from posttrain.algos.utils import check_finite, check_same_shape, masked_sum, masked_whiten

__all__ = [
    "AdvantageInputs",
    "AdvantageOutput",
    "sequence_scores",
    "discounted_returns",
    "gae_advantages",
    "grpo_advantages",
    "drgrpo_advantages",
    "rloo_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "grpo_passk_advantages",
]


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: Tensor  # (B, T), 0 where the response mask is 0
    returns: Tensor  # (B, T), 0 where the response mask is 0


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may read, so a trainer can call any of them by name.

    Which fields an estimator needs is listed in `posttrain.algos.registry.ADVANTAGE_ESTIMATORS`.
    """

    token_rewards: Tensor  # (B, T) or (B,) scores
    response_mask: Tensor  # (B, T)
    group_ids: Tensor | None = None  # (B,) integer prompt/group id
    values: Tensor | None = None  # (B, T) critic values, for gae
    baseline_scores: Tensor | None = None  # (B,) greedy-rollout scores, for remax


def sequence_scores(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Per-sequence score: masked sum of token rewards, or the scores as given.  # (B, T)|(B,) -> (B,)"""
    if not rewards.dtype.is_floating_point:
        rewards = rewards.float()  # integer 0/1 correctness scores are common; the means below need floats
    if rewards.dim() == 2:
        check_same_shape(token_rewards=rewards, response_mask=response_mask)
        check_finite("token_rewards", rewards)
        return masked_sum(rewards, response_mask, dim=-1)
    if rewards.dim() == 1 and rewards.shape[0] == response_mask.shape[0]:
        check_finite("scores", rewards)
        return rewards
    raise ValueError(
        f"rewards has shape {tuple(rewards.shape)}; expected token-level rewards shaped like "
        f"response_mask {tuple(response_mask.shape)} or one score per sequence ({response_mask.shape[0]},)"
    )


def first_rows(episode_index: Tensor) -> Tensor:
    """The first row of each episode.  # (B,) episode index 0..E-1 -> (E,) row index"""
    rows = torch.arange(episode_index.shape[0], device=episode_index.device)
    count = int(episode_index.max().item()) + 1 if episode_index.numel() else 0
    start = torch.full((count,), episode_index.shape[0], dtype=rows.dtype, device=rows.device)
    return start.scatter_reduce(0, episode_index, rows, reduce="amin")


def per_episode(estimator: Callable[[AdvantageInputs], AdvantageOutput], inputs: AdvantageInputs, episode_index: Tensor) -> AdvantageOutput:
    """``estimator`` (an outcome estimator, no values) over episodes that may span several rows (module
    docstring). ``episode_index`` (B,): each row's episode, 0..E-1.  # inputs (B rows), (B,) -> 2 x (B, T)"""
    if inputs.values is not None:
        raise ValueError("per_episode is for outcome estimators; a critic's values are per token of each sample")
    if tuple(episode_index.shape) != (inputs.response_mask.shape[0],):
        raise ValueError(f"episode_index has shape {tuple(episode_index.shape)}; it needs one episode per row ({inputs.response_mask.shape[0]},)")
    rewards = inputs.token_rewards.float()
    rows = rewards.sum(-1) if rewards.dim() == 2 else rewards  # a row without response tokens keeps its score too
    first = first_rows(episode_index)
    # the episode's score: its samples' mean (they share the score; shaping, e.g. a KL or overlong term, is each one's own)
    count = torch.zeros(first.shape[0], dtype=rows.dtype, device=rows.device).index_add_(0, episode_index, torch.ones_like(rows))
    scores = torch.zeros_like(count).index_add_(0, episode_index, rows) / count
    pick = lambda tensor: None if tensor is None else tensor[first]  # noqa: E731
    one = torch.ones((first.shape[0], 1), dtype=inputs.response_mask.dtype, device=inputs.response_mask.device)
    out = estimator(AdvantageInputs(scores.unsqueeze(-1), one, group_ids=pick(inputs.group_ids), baseline_scores=pick(inputs.baseline_scores)))
    valid = inputs.response_mask != 0
    spread = lambda per_episode_value: torch.where(valid, per_episode_value[:, 0][episode_index].unsqueeze(-1), 0.0)  # noqa: E731
    return AdvantageOutput(spread(out.advantages), spread(out.returns))


def _spread(per_sequence: Tensor, response_mask: Tensor) -> AdvantageOutput:
    # (B,) -> (B, T): every valid token of a sequence carries the sequence's advantage.
    advantages = torch.where(response_mask != 0, per_sequence.unsqueeze(-1), 0.0)
    return AdvantageOutput(advantages, advantages)


def _reverse_discounted_cumsum(values: Tensor, response_mask: Tensor, discount: float) -> Tensor:
    # (B, T) -> (B, T): out_t = x_t + discount * out_{next valid t'}; masked positions are skipped.
    valid = response_mask != 0
    out = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        running = torch.where(valid[:, t], values[:, t] + discount * running, running)
        out[:, t] = running
    return torch.where(valid, out, torch.zeros_like(out))


def _next_valid_values(values: Tensor, response_mask: Tensor) -> Tensor:
    # (B, T) -> (B, T): the value at the next valid position after t (0 after the last one).
    valid = response_mask != 0
    out = torch.zeros_like(values)
    upcoming = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        out[:, t] = upcoming
        upcoming = torch.where(valid[:, t], values[:, t], upcoming)
    return out


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """G_t = r_t + gamma * G_{next valid t}, 0 at masked positions.  # (B, T), (B, T) -> (B, T)"""
    check_same_shape(token_rewards=token_rewards, response_mask=response_mask)
    check_finite("token_rewards", token_rewards)
    return _reverse_discounted_cumsum(token_rewards, response_mask, gamma)


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> AdvantageOutput:
    """Generalised advantage estimation.  # (B, T), (B, T), (B, T) -> 2 x (B, T)

    returns = GAE + values (before whitening); advantages are whitened over the batch when `whiten`.
    The value after a sequence's last valid token is 0 (the episode ends there).
    """
    check_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    check_finite("token_rewards", token_rewards)
    deltas = token_rewards + gamma * _next_valid_values(values, response_mask) - values
    advantages = _reverse_discounted_cumsum(deltas, response_mask, gamma * lam)
    returns = torch.where(response_mask != 0, advantages + values, torch.zeros_like(values))
    if whiten:
        advantages = masked_whiten(advantages, response_mask)
    return AdvantageOutput(advantages, returns)


def grpo_advantages(
    rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_by_std: bool = True
) -> AdvantageOutput:
    """GRPO outcome advantage: (s - group mean) / (group std + eps).  # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)

    `scale_by_std=False` is Dr.GRPO (verl: `norm_adv_by_std_in_grpo=False`).
    """
    scores = sequence_scores(rewards, response_mask)
    return _spread(group_normalize(scores, group_ids, eps=eps, scale_by_std=scale_by_std), response_mask)


def drgrpo_advantages(rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> AdvantageOutput:
    """Dr.GRPO outcome advantage: s - group mean.  # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)"""
    return grpo_advantages(rewards, response_mask, group_ids, scale_by_std=False)


def rloo_advantages(rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> AdvantageOutput:
    """Leave-one-out baseline: s_i - mean_{j != i in group} s_j.  # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)

    Equals n / (n - 1) * (s_i - group mean); a group of one gets 0.
    """
    scores = sequence_scores(rewards, response_mask)
    stats = group_stats(scores, group_ids)
    loo = (scores - stats.mean) * stats.count / (stats.count - 1).clamp_min(1)
    flat = stats.constant | (stats.count < 2)
    return _spread(torch.where(flat, torch.zeros_like(loo), loo), response_mask)


def reinforce_plus_plus_advantages(
    token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0
) -> AdvantageOutput:
    """REINFORCE++: discounted returns, whitened over the batch.  # (B, T), (B, T) -> 2 x (B, T)

    Needs token-level rewards (a KL penalty per token is typically already folded in).
    """
    if token_rewards.dim() != 2:
        raise ValueError(
            f"reinforce_plus_plus needs token-level rewards (B, T); got shape {tuple(token_rewards.shape)}"
        )
    returns = discounted_returns(token_rewards, response_mask, gamma=gamma)
    return AdvantageOutput(masked_whiten(returns, response_mask), returns)


def reinforce_plus_plus_baseline_advantages(
    rewards: Tensor, response_mask: Tensor, group_ids: Tensor
) -> AdvantageOutput:
    """REINFORCE++-baseline: s - group mean, spread over tokens, whitened over the batch.

    # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)
    """
    scores = sequence_scores(rewards, response_mask)
    centred = _spread(group_normalize(scores, group_ids, scale_by_std=False), response_mask).advantages
    advantages = masked_whiten(centred, response_mask)
    return AdvantageOutput(advantages, advantages)


def remax_advantages(rewards: Tensor, response_mask: Tensor, baseline_scores: Tensor) -> AdvantageOutput:
    """ReMax: s - score of the greedy response to the same prompt.  # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)

    returns: the reward-to-go sum_{t' >= t} r_t' over valid tokens, as verl's; scores (B,) count as
    a reward on the last token, so every valid token's return is the score.
    """
    scores = sequence_scores(rewards, response_mask)
    if baseline_scores.shape != scores.shape:
        raise ValueError(
            f"baseline_scores has shape {tuple(baseline_scores.shape)}; expected {tuple(scores.shape)}, "
            "the greedy-rollout score for each sequence's prompt"
        )
    check_finite("baseline_scores", baseline_scores)
    advantages = _spread(scores - baseline_scores.to(scores.dtype), response_mask).advantages
    if rewards.dim() == 1:
        return AdvantageOutput(advantages, _spread(scores, response_mask).returns)
    return AdvantageOutput(advantages, discounted_returns(rewards.to(scores.dtype), response_mask))


def grpo_passk_advantages(
    rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_by_std: bool = False
) -> AdvantageOutput:
    """Pass@k: the group's best gets (best - second best), others 0.  # (B,T)|(B,), (B,T), (B,) -> 2 x (B,T)

    `scale_by_std=True` divides the gap by (group std + eps), as verl does by default.
    """
    scores = sequence_scores(rewards, response_mask)
    gap = group_best_gap(scores, group_ids)
    if scale_by_std:
        gap = gap / (group_stats(scores, group_ids).std + eps)
    return _spread(gap, response_mask)
