"""How a step gets scored samples: between the workers (which sample) and the trainer (which learns).

    SingleTurnRollout   actor.generate → reward manager (and reward model) on the last response token
    AgentRollout        the agent loop driving actor.generate_turn → environment rewards
    ProgramRollout      a user's own agent program per row, against the run's endpoint (env.name: program)
    MixtureRollout      several sources in one run (``mixture``): each row to its source's own rollout

Both take prompts already repeated into groups and return the batch with responses, model inputs
and TOKEN_SCORES, plus metrics. The trainer picks one at start (``env.name``) and its loop never
branches on which. The same classes run inside each asynchronous generator (``rollout/generator.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain.config.mixture import mixture_sources
from posttrain.config.schema import PosttrainConfig
from posttrain.rollout.agent import AgentRollout
from posttrain.rollout.batching import group_ids_of, join_rollouts, repeat_for_groups, sequences_to_batch
from posttrain.rollout.calls import CallsAnswers, answers_with_calls
from posttrain.rollout.environments import load_env_class
from posttrain.rollout.guidance import Guidance
from posttrain.rollout.mixture import MixtureRollout, source_dirs
from posttrain.rollout.program import ProgramRollout
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.scoring import reward_manager_for
from posttrain.rollout.single_turn import SingleTurnRollout

Rollout = SingleTurnRollout | AgentRollout | ProgramRollout | MixtureRollout


def build_rollout(config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | Mapping[str, Path] | None) -> Rollout:
    """The rollout ``env.name`` asks for: agent episodes in that environment, or single responses
    scored by the reward manager (``custom_reward_function``, ``reward_model.reward_manager``), read
    into their calls first where the calls are the answer (``env.options.answer: calls``, rollout/calls.py).
    With a ``mixture``, each source's own, behind one :class:`MixtureRollout` (``data_dir`` by source name)."""
    sources = mixture_sources(config)
    if sources:
        dirs = source_dirs(data_dir, sources)
        return MixtureRollout(sources, lambda source: _one_rollout(source.config, tokenizer, dirs[source.name], source.max_new_tokens),
                              tokenizer.pad_token_id)
    return _one_rollout(config, tokenizer, data_dir)


def _one_rollout(config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None,
                 max_new_tokens: int | None = None) -> SingleTurnRollout | AgentRollout | ProgramRollout:
    calls = answers_with_calls(config.env)
    if config.env.name is not None and not calls:
        env = config.env
        if load_env_class(env.name, env.path, env.class_name).runs_program:
            return ProgramRollout(config, tokenizer, data_dir)
        return AgentRollout(config, tokenizer, data_dir)
    guidance = Guidance(tokenizer, config.data.max_response_length) if config.algorithm.guidance.enable else None
    return SingleTurnRollout(reward_manager_for(config, tokenizer), config.data.max_response_length, tokenizer.pad_token_id,
                             CallsAnswers(config.env, tokenizer) if calls else None, config.env.reward_norm, max_new_tokens, guidance)


__all__ = [
    "AgentRollout", "MixtureRollout", "ProgramRollout", "Rollout", "RolloutRoles", "SingleTurnRollout", "build_rollout", "group_ids_of", "join_rollouts",
    "repeat_for_groups", "sequences_to_batch",
]
