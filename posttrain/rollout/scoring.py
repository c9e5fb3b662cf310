"""The one reward path, as every rollout reaches it: the run's reward manager (``custom_reward_function``,
``reward_model.reward_manager``: a data source's score function, a custom or a batched one, in a child
process with a deadline each; rewards/manager.py), and the episodes' answers scored by it.

An environment hands its episode's final answer to the rollout (``StepResult.answer``) instead of
scoring it; after the episodes end, every answer is scored in one call, its score added to the reward
of the turn that gave it (capped where the environment says), and the episode's success is the score
function's ``acc`` (else score >= 1, as an environment's own judge counts it). A failed or late score
is 0 and counted (``reward/errors``, ``reward/timeouts`` of ``reward/samples``) for the reward breaker.

A rubric with judge parts (rewards/judge.py) asks the environment's model: every rollout connects the judge
when it opens (:func:`open_judge`, a client of its own with the judge's reply cache, reporting ``judge/*``)
and the run checks it against its rules before step 1 (:func:`check_judge`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dataclasses import replace
from pathlib import Path

from posttrain.agents import Episode, EpisodeSample
from posttrain.config.schema import PosttrainConfig
from posttrain.metrics import Metrics
from posttrain.rewards import build_reward_manager
from posttrain.rewards.judge import JudgeDisagrees, agreement
from posttrain.rewards.manager import Answer, BatchRewardManager, RewardManager
from posttrain.rollout.env_llm import open_env_llm
from posttrain.rollout.roles import RolloutRoles


def reward_manager_for(config: PosttrainConfig, tokenizer: Any) -> RewardManager | BatchRewardManager:
    """The run's reward manager, as its config says."""
    reward = config.custom_reward_function
    manager = build_reward_manager(
        tokenizer, custom_path=reward.path, custom_name=reward.name, reward_kwargs=reward.reward_kwargs,
        timeout_s=reward.timeout_s, budget_s=reward.step_timeout_s, batched=config.reward_model.reward_manager == "batch",
        rubric=[dict(part) for part in config.reward.rubric],
    )
    if isinstance(manager, RewardManager) and manager.judged:  # connected by open_judge, when the rollout opens
        manager.judge_llm = replace(config.env.llm, reply_cache=judge_cache(config))
        manager.judge_timeout_s = config.reward.judge.timeout_s
    return manager


def judge_cache(config: PosttrainConfig) -> str | None:
    """``reward.judge.cache``'s file: ``auto`` is judge_cache.sqlite in the run's directory, so a resume finds it."""
    cache = config.reward.judge.cache
    return str(Path(config.trainer.default_local_dir) / "judge_cache.sqlite") if cache == "auto" else cache


def open_judge(manager: RewardManager | BatchRewardManager, roles: RolloutRoles) -> None:
    """Connect the rubric's judge (when it has judge parts) to the environment's model: its own client of
    the Env-LLM worker or of ``env.llm.url``, with the judge's reply cache. Every rollout's ``open`` calls it."""
    if isinstance(manager, RewardManager) and manager.judge_llm is not None and manager.judge is None:
        manager.judge = open_env_llm(manager.judge_llm, roles.env_llm)
        manager.judge.metric_prefix = "judge"


def check_judge(config: PosttrainConfig, manager: RewardManager | BatchRewardManager, samples: Sequence[EpisodeSample]) -> None:
    """Before step 1, on ``samples`` (``reward.judge.agreement_rows`` rows): each judge part with a rule asked
    about answers the rule decides (rewards/judge.py
    :func:`agreement`); the agreement printed, and a judge below ``reward.judge.min_agreement`` refused."""
    settings = config.reward.judge
    if not isinstance(manager, RewardManager) or not manager.judged or settings.min_agreement is None or manager.judge is None:
        return
    rows = [(s.prompt, s.ground_truth, s.data_source, s.extra_info) for s in samples]
    for part in manager.rubric.judged:
        if part.judge.rule is None:
            print(f"posttrain: judge part {part.name!r} has no rule, so its agreement is not checked")
            continue
        found = agreement(part.judge, manager.judge, rows, settings.timeout_s)
        manager.judge.drain_metrics()  # the check's requests are not the first step's
        model = config.env.llm.url or config.env.llm.model_path
        if not found.decided:
            print(f"posttrain: judge part {part.name!r} is not checked: its rule decides no right and wrong answer among the "
                  f"{len(rows)} rows (it needs rows with a plain gold answer the rule accepts, and another it rejects)")
            continue
        summary = (f"{found.share:.2f} of {found.asked} answers (right ones: {found.right[0]} of {found.right[1]}, wrong ones: "
                   f"{found.wrong[0]} of {found.wrong[1]}; {found.readable} replies readable)")
        print(f"posttrain: judge part {part.name!r} ({model}) agrees with its rule on {summary}; "
              f"reward.judge.min_agreement={settings.min_agreement:g}")
        if found.share < settings.min_agreement:
            raise JudgeDisagrees(
                f"judge part {part.name!r} ({model}) agrees with its rule on {summary}, below reward.judge.min_agreement="
                f"{settings.min_agreement:g}: its scores would teach what the rule does not. Give the judge a clearer prompt "
                "or a stronger model (env.llm.model_path, or env.llm.url), or lower reward.judge.min_agreement (null: no check)"
            )


def score_episode_answers(manager: RewardManager | BatchRewardManager, episodes: Sequence[Episode],
                          samples: Sequence[EpisodeSample]) -> tuple[Metrics, str | None]:
    """Score the answers the episodes handed over (module docstring), in place; the reward metrics and
    the first failure (None when there were no answers, or none failed)."""
    asked = [row for row, episode in enumerate(episodes) if episode.answer is not None]
    if not asked:
        return {}, None
    scored = manager.score([Answer(episodes[row].answer.text, samples[row].ground_truth, samples[row].data_source,
                                   dict(samples[row].extra_info), prompt=samples[row].prompt) for row in asked])
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
