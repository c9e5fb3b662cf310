"""Step metrics from a finished batch, with verl's names so dashboards carry over.

All functions are pure: a Batch (and timings) in, a flat ``{name: float}`` out. These are made
once per step from the whole batch and never merged, so they are plain floats; metrics made in
pieces (per rank, unit, round) carry their merge rule (:mod:`posttrain.metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from posttrain import keys
from posttrain.algos import explained_variance
from posttrain.algos.shaping import rows_of_varied_groups
from posttrain.protocol import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


def uniform_group_share(scores: torch.Tensor, group_ids: torch.Tensor) -> float:
    """The share of groups whose samples all scored the same: under group advantages (GRPO, RLOO) they
    teach nothing, so a high share says the step learnt from few prompts. Of the batch trained on: after
    dynamic sampling (``algorithm.filter_groups``) or ``env.filter_groups_quantile`` dropped groups, it
    counts the ones kept.  # (B,), (B,) -> float"""
    groups = torch.unique(group_ids)
    varied = torch.unique(group_ids[rows_of_varied_groups(scores, group_ids)])
    return (groups.numel() - varied.numel()) / groups.numel() if groups.numel() else 0.0


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """critic/{score,rewards,advantages,returns,values}/*, response_length/*, prompt_length/*, and
    ``critic/score/uniform_groups`` (:func:`uniform_group_share`) where the batch has groups. ``critic/score/*``
    but ``uniform_groups`` leave out the rows guidance gave a reference answer (GUIDED); the rest, and
    ``uniform_groups`` (of the groups trained on), count every row trained on."""
    response_mask = batch[keys.RESPONSE_MASK]
    metrics: dict[str, float] = {}
    if keys.TOKEN_SCORES in batch:
        scores = batch[keys.TOKEN_SCORES].sum(-1)
        # the policy's own answers only: a reference answer given by guidance (rollout/guidance.py) is not its score
        metrics |= _stats("critic/score", scores[~batch[keys.GUIDED]] if keys.GUIDED in batch else scores)
        if keys.GROUP_IDS in batch and torch.unique(batch[keys.GROUP_IDS]).numel() < len(batch):  # groups of one: not said
            metrics["critic/score/uniform_groups"] = uniform_group_share(scores, batch[keys.GROUP_IDS])
    if keys.TOKEN_REWARDS in batch:
        metrics |= _stats("critic/rewards", batch[keys.TOKEN_REWARDS].sum(-1))
    for key, name in ((keys.ADVANTAGES, "advantages"), (keys.RETURNS, "returns"), (keys.VALUES, "values")):
        if key in batch:
            metrics |= _masked_stats(f"critic/{name}", batch[key], response_mask)
    if keys.VALUES in batch and keys.RETURNS in batch:
        metrics["critic/vf_explained_var"] = explained_variance(batch[keys.VALUES], batch[keys.RETURNS], response_mask).item()
    response_length = response_mask.sum(-1).float()
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    if keys.PROMPT_MASK in batch:
        metrics |= _stats("prompt_length", batch[keys.PROMPT_MASK].sum(-1))
    return metrics


def timing_metrics(timings_s: Mapping[str, float], batch: Batch) -> dict[str, float]:
    """timing_s/<phase>, timing_per_token_ms/<phase>, perf/{total_num_tokens,time_per_step,throughput}.

    Per-token times divide by the tokens a phase touches: generation by response tokens, the rest
    by all tokens (prompt + response).
    """
    response_tokens = batch[keys.RESPONSE_MASK].sum().item()
    prompt_tokens = batch[keys.PROMPT_MASK].sum().item() if keys.PROMPT_MASK in batch else 0
    total_tokens = response_tokens + prompt_tokens
    metrics = {f"timing_s/{phase}": seconds for phase, seconds in timings_s.items()}
    for phase, seconds in timings_s.items():
        if phase == "step":
            continue
        tokens = response_tokens if phase == "gen" else total_tokens
        if tokens:
            metrics[f"timing_per_token_ms/{phase}"] = 1000 * seconds / tokens
    step_seconds = timings_s.get("step", sum(timings_s.values()))
    metrics |= {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / step_seconds if step_seconds > 0 else 0.0,
    }
    return metrics
