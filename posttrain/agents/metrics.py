"""Step metrics of a batch of finished episodes (pure: episodes in, ``{name: float}`` out).

``num_turns/{mean,max,min}``; ``agent/{valid,effective}_action_ratio`` over all turns;
``agent/episodes`` (their number); ``agent/success_rate``, ``agent/forced_final_ratio``, ``agent/out_of_tokens_ratio`` over episodes;
``agent/observations_truncated`` per episode; ``agent/reward_std_in_group`` (the mean over groups
of the episode-reward spread inside a group: near 0 means the group teaches nothing);
``env/<count>``, each counter the environment reports summed over the step's episodes (``env/searches``:
the searches of the step; per episode, divide by ``agent/episodes``), a count logged once, which the
circuit breakers read as it was made; and ``env/<ratio>`` for each ratio of counters it declares
(``env/relevant_question_ratio``). A counter or ratio whose name already has a namespace (``tool/calls``)
is reported under that name. Each metric is typed with its merge rule (:mod:`posttrain.metrics`):
episodes and counters add up, means weigh by their episodes (turns, groups).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from posttrain.agents.loop import Episode
from posttrain.metrics import Metrics, maximum, mean, minimum, total


def episode_metrics(
    episodes: Sequence[Episode], group_ids: Sequence[int] | None = None, counters: Sequence[str] = (),
    ratios: Mapping[str, tuple[str, str]] | None = None,
) -> Metrics:
    """``counters``: counter names to report even when no episode saw them (stable metric names);
    ``ratios``: ``env/<name>`` = a counter's total over another's, across the episodes (0 when the
    denominator is 0), e.g. relevant questions over all questions."""
    if not episodes:
        return {}
    turns = np.array([e.num_turns for e in episodes], dtype=float)
    total_turns = max(turns.sum(), 1.0)
    n = len(episodes)
    metrics = {
        "agent/episodes": total(n),
        "num_turns/mean": mean(float(turns.mean()), n), "num_turns/max": maximum(float(turns.max())), "num_turns/min": minimum(float(turns.min())),
        "agent/valid_action_ratio": mean(sum(e.valid_actions for e in episodes) / total_turns, total_turns),
        "agent/effective_action_ratio": mean(sum(e.effective_actions for e in episodes) / total_turns, total_turns),
        "agent/success_rate": mean(float(np.mean([e.success for e in episodes])), n),
        "agent/forced_final_ratio": mean(float(np.mean([e.forced_final for e in episodes])), n),
        "agent/out_of_tokens_ratio": mean(float(np.mean([e.out_of_tokens for e in episodes])), n),
        "agent/observations_truncated": mean(float(np.mean([e.observations_truncated for e in episodes])), n),
    }
    metrics |= counter_metrics([e.counts for e in episodes], counters, ratios)
    if group_ids is not None:
        groups: dict[int, list[float]] = defaultdict(list)
        for group, episode in zip(group_ids, episodes, strict=True):
            groups[int(group)].append(episode.reward)
        metrics["agent/reward_std_in_group"] = mean(float(np.mean([np.std(rewards) for rewards in groups.values()])), len(groups))
    return metrics


def counter_metrics(counts: Sequence[Mapping[str, float]], counters: Sequence[str] = (),
                    ratios: Mapping[str, tuple[str, str]] | None = None) -> Metrics:
    """Each counter summed over the episodes' (or single responses') ``counts``, and each ratio of two
    counters' sums."""
    if not counts:
        return {}
    names = sorted({name for count in counts for name in count} | set(counters))
    metrics = {counter_metric_name(name): total(sum(count.get(name, 0.0) for count in counts)) for name in names}
    for name, (numerator, denominator) in (ratios or {}).items():
        below = sum(count.get(denominator, 0.0) for count in counts)
        metrics[counter_metric_name(name)] = mean(sum(count.get(numerator, 0.0) for count in counts) / below if below else 0.0, below)
    return metrics


def counter_metric_name(counter: str) -> str:
    """``env/<counter>``, or the counter's own name where it has a namespace (``tool/calls``)."""
    return counter if "/" in counter else f"env/{counter}"
