"""The one reward path, as every rollout reaches it: the run's reward manager (``custom_reward_function``,
``reward_model.reward_manager``: a data source's score function, a custom or a batched one, in a child
process with a deadline each; rewards/manager.py), and the episodes' answers scored by it.

An environment hands its episode's final answer to the rollout (``StepResult.answer``) instead of
scoring it; after the episodes end, every answer is scored in one call, its score added to the reward
of the turn that gave it (capped where the environment says), and the episode's success is the score
function's ``acc`` (else score >= 1, as an environment's own judge counts it). A failed or late score
is 0 and counted (``reward/errors``, ``reward/timeouts`` of ``reward/samples``) for the reward breaker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from posttrain.agents import Episode, EpisodeSample
from posttrain.config.schema import PosttrainConfig
from posttrain.metrics import Metrics
from posttrain.rewards import build_reward_manager
from posttrain.rewards.manager import Answer, BatchRewardManager, RewardManager


def reward_manager_for(config: PosttrainConfig, tokenizer: Any) -> RewardManager | BatchRewardManager:
    """The run's reward manager, as its config says."""
    reward = config.custom_reward_function
    return build_reward_manager(
        tokenizer, custom_path=reward.path, custom_name=reward.name, reward_kwargs=reward.reward_kwargs,
        timeout_s=reward.timeout_s, budget_s=reward.step_timeout_s, batched=config.reward_model.reward_manager == "batch",
        rubric=[dict(part) for part in config.reward.rubric],
    )


def score_episode_answers(manager: RewardManager | BatchRewardManager, episodes: Sequence[Episode],
                          samples: Sequence[EpisodeSample]) -> tuple[Metrics, str | None]:
    """Score the answers the episodes handed over (module docstring), in place; the reward metrics and
    the first failure (None when there were no answers, or none failed)."""
    asked = [row for row, episode in enumerate(episodes) if episode.answer is not None]
    if not asked:
        return {}, None
    scored = manager.score([Answer(episodes[row].answer.text, samples[row].ground_truth, samples[row].data_source,
                                   dict(samples[row].extra_info)) for row in asked])
    acc = scored.extra.get("acc")
    for index, row in enumerate(asked):
        episode = episodes[row]
        score = float(scored.scores[index])
        success = success_of(score, None if acc is None else acc[index])
        if episode.answer.score_cap is not None:
            score = min(score, episode.answer.score_cap)
        episode.turn_rewards[episode.answer_turn] += score
        episode.success = episode.success or success
    return scored.metrics, scored.first_failure


def success_of(score: float, reported: Any) -> bool:
    """An answer's success: the score function's ``acc`` where it reported one, else score >= 1."""
    return score >= 1.0 if reported is None or (isinstance(reported, float) and math.isnan(reported)) else bool(reported)
