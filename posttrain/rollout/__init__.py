"""How a step gets scored samples: between the workers (which sample) and the trainer (which learns).

    SingleTurnRollout   actor.generate → reward manager (and reward model) on the last response token
    AgentRollout        the agent loop driving actor.generate_turn → environment rewards

Both take prompts already repeated into groups and return the batch with responses, model inputs
and TOKEN_SCORES, plus metrics. The trainer picks one at start (``env.name``) and its loop never
branches on which. The same classes run inside each asynchronous generator (``rollout/generator.py``).
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain.config.schema import PosttrainConfig
from posttrain.rewards import build_reward_manager
from posttrain.rollout.agent import AgentRollout
from posttrain.rollout.batching import group_ids_of, join_rollouts, repeat_for_groups, sequences_to_batch
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.single_turn import SingleTurnRollout

Rollout = SingleTurnRollout | AgentRollout


def build_rollout(config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None) -> Rollout:
    """The rollout ``env.name`` asks for: agent episodes in that environment, or single responses
    scored by the reward manager (``custom_reward_function``, ``reward_model.reward_manager``)."""
    if config.env.name is not None:
        return AgentRollout(config, tokenizer, data_dir)
    reward = config.custom_reward_function
    manager = build_reward_manager(
        tokenizer, custom_path=reward.path, custom_name=reward.name, reward_kwargs=reward.reward_kwargs,
        timeout_s=reward.timeout_s, budget_s=reward.step_timeout_s, batched=config.reward_model.reward_manager == "batch",
    )
    return SingleTurnRollout(manager, config.data.max_response_length, tokenizer.pad_token_id)


__all__ = [
    "AgentRollout", "Rollout", "RolloutRoles", "SingleTurnRollout", "build_rollout", "group_ids_of", "join_rollouts",
    "repeat_for_groups", "sequences_to_batch",
]
