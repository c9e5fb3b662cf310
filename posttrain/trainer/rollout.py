"""How a step gets scored responses: one turn per prompt, or multi-turn episodes in environments.

Both rollouts take prompts already repeated into groups and return the batch with responses,
model inputs and TOKEN_SCORES, plus metrics:

    SingleTurnRollout   actor.generate → reward manager (and reward model) on the last response token
    AgentRollout        the agent loop (agents/loop.py) driving actor.generate_turn → environment rewards

For an agent episode the "response" is everything after the prompt: agent turns and observations.
RESPONSE_MASK (the loss mask) is 1 on agent tokens only; the attention mask covers both, so the
policy sees the observations but is never trained to produce them. The trainer picks one rollout
at start (``env.name``) and the loop itself does not branch on it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain import keys
from posttrain.agents import (
    AgentLoopConfig, Environment, Episode, EpisodeSample, ObservationRenderer, TurnOutput, env_factory, episode_metrics,
    load_env_class, run_episodes,
)
from posttrain.agents.env_llm import EnvLLMClient
from posttrain.agents.registry import probe_environment, wanted_resources
from posttrain.algos import groups_with_spread, normalize_episode_rewards
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import critic_enabled
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.models import resolve_model
from posttrain.protocol import Batch, pad_rows
from posttrain.rewards import build_reward_manager
from posttrain.trainer.data_setup import check_scorable
from posttrain.trainer.env_llm import open_env_llm
from posttrain.trainer.metrics import timed
from posttrain.trainer.retriever_service import RetrieverHandle, corpus_path, open_retriever
from posttrain.workers.policy import VALIDATE_META_KEY
from posttrain.workers.rollout_batch import prompt_token_lists


def build_rollout(config: PosttrainConfig, tokenizer: Any, data_dir: Path | None) -> SingleTurnRollout | AgentRollout:
    """The rollout ``env.name`` asks for: agent episodes in that environment, or single responses
    scored by the reward manager (``custom_reward_function``, ``reward_model.reward_manager``)."""
    if config.env.name is not None:
        return AgentRollout(config, tokenizer, data_dir)
    reward = config.custom_reward_function
    return SingleTurnRollout(build_reward_manager(
        tokenizer, custom_path=reward.path, custom_name=reward.name, reward_kwargs=reward.reward_kwargs,
        timeout_s=reward.timeout_s, budget_s=reward.step_timeout_s, batched=config.reward_model.reward_manager == "batch",
    ))


def validation_view(batch: Batch) -> Batch:
    return Batch(batch.tensors, batch.non_tensors, batch.meta | {VALIDATE_META_KEY: True})


class SingleTurnRollout:
    """One response per row from ``actor.generate``, scored by the reward manager (+ reward model)."""

    def __init__(self, reward_manager: Any) -> None:
        self.reward_manager = reward_manager
        self.first_failures: dict[str, str] = {}  # of the last rollout, by circuit breaker (trainer/breakers.py)

    def check_data(self, **datasets: Any) -> None:
        """Refuse, before any worker starts, a prompt the reward manager's table cannot score (its
        data source has no function, its ground truth is missing); a custom function takes any."""
        if self.reward_manager.score_function is None:
            check_scorable(self.reward_manager.score_functions, datasets.values())

    def open(self, roles: Any) -> None:
        """Nothing to start."""

    def close(self) -> None:
        """Stop the reward's scoring process (started again by the next scoring call, if any)."""
        self.reward_manager.close()

    def __call__(
        self, roles: Any, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None, whole_batch: bool = True,
    ) -> tuple[Batch, dict[str, float]]:
        timings = {} if timings is None else timings
        with timed(timings, "gen"):
            generated = roles.actor.generate(validation_view(batch) if validate else batch)
        with timed(timings, "reward"):
            return self.score(roles, batch.union(generated.select(meta_keys=[]) if validate else generated))

    def finish_batch(self, batch: Batch, metrics: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """Nothing is decided across the whole batch."""
        return batch, metrics

    def score(self, roles: Any, batch: Batch) -> tuple[Batch, dict[str, float]]:
        result = self.reward_manager(batch)
        self.first_failures = {"reward": result.first_failure} if result.first_failure else {}
        scored = batch.union(result.to_batch().select(meta_keys=[]))
        if roles.reward_model is not None:
            model_scores = roles.reward_model.compute_rm_score(batch)[keys.TOKEN_SCORES]
            scored.tensors[keys.TOKEN_SCORES] = scored[keys.TOKEN_SCORES] + model_scores
        return scored, {k: float(v) for k, v in result.metrics.items()}


class AgentRollout:
    """Multi-turn episodes in ``env.name``'s environment; rewards come from the environment."""

    def __init__(self, config: PosttrainConfig, tokenizer: Any, data_dir: Path | None) -> None:
        env = config.env
        self.config, self.tokenizer, self.data_dir = config, tokenizer, data_dir
        self.env_class = load_env_class(env.name, env.path, env.class_name)
        self.renderer = ObservationRenderer(tokenizer, env.observation_role)
        self.loop_config = AgentLoopConfig(
            max_response_length=config.data.max_response_length, max_turns=env.max_turns,
            turns_range=tuple(env.turns_range) if env.turns_range else None, max_turn_tokens=env.max_turn_tokens,
            max_obs_length=env.max_obs_length, seed=config.trainer.seed,
        )
        self.resources = wanted_resources(self.env_class, env.options)
        probe = probe_environment(self.env_class, env.options)
        self.stop_strings = probe.stop_strings  # what ends an agent turn inside the engine
        if "retriever" in self.resources and not env.retriever.url:
            corpus_path(env.retriever, data_dir)
        if "env_llm" in self.resources and not env.llm.url:
            resolve_model(env.llm.model_path)  # a missing model fails here, not in a worker
        self.retriever: RetrieverHandle | None = None
        self.env_llm: EnvLLMClient | None = None
        self.make_env: Callable[[], Environment] | None = None
        self.batch_shape = update_batch_shape(config)
        self.first_failures: dict[str, str] = {}  # of the last rollout, by circuit breaker (trainer/breakers.py)

    def check_data(self, **datasets: Any) -> None:
        """Refuse, before any worker starts, a prompt the environment cannot play (its ``check_sample``)."""
        for split, dataset in datasets.items():
            for index, sample in enumerate(dataset.samples if dataset is not None else ()):
                try:
                    self.env_class.check_sample(EpisodeSample(list(sample.messages), sample.ground_truth, sample.data_source, dict(sample.extra_info or {})))
                except ValueError as error:
                    raise ValueError(f"{split} prompt {index}: {error}") from None

    def open(self, roles: Any) -> None:
        """Connect the resources the environment asks for: the retriever (started for the run, or
        at env.retriever.url) and the Env-LLM (the run's worker, or env.llm.url)."""
        resources: dict[str, Any] = {}
        if "retriever" in self.resources:
            self.retriever = open_retriever(self.config.env.retriever, self.data_dir)
            resources["retriever"] = self.retriever.client
        if "env_llm" in self.resources:
            self.env_llm = open_env_llm(self.config.env.llm, getattr(roles, "env_llm", None))
            resources["env_llm"] = self.env_llm
        self.make_env = env_factory(self.env_class, self.config.env.options, resources)

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
            self.retriever = None
        if self.env_llm is not None:
            self.env_llm.close()
            self.env_llm = None
        self.make_env = None

    def __call__(
        self, roles: Any, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None, whole_batch: bool = True,
    ) -> tuple[Batch, dict[str, float]]:
        """Episodes for ``batch``'s rows, scored. ``whole_batch=False`` (a part of a training batch, as
        an asynchronous generator produces it) leaves :meth:`finish_batch` to whoever joins the parts."""
        if self.make_env is None:
            raise RuntimeError("AgentRollout.open(roles) must be called before rollouts (it connects the retriever and the Env-LLM)")
        envs = [self.make_env() for _ in range(len(batch))]
        samples = [
            EpisodeSample(list(prompt), truth, str(source), dict(extra or {}))
            for prompt, truth, source, extra in zip(
                batch[keys.RAW_PROMPT], batch[keys.GROUND_TRUTH], batch[keys.DATA_SOURCE], batch[keys.EXTRA_INFO]
            )
        ]

        def generate(contexts: Sequence[Sequence[int]], max_new_tokens: int, stop: tuple[str, ...], turn: int) -> list[TurnOutput]:
            request = Batch.from_dict(non_tensors={keys.TURN_CONTEXT_IDS: [list(c) for c in contexts]}, meta={
                keys.TURN_MAX_NEW_TOKENS: max_new_tokens, keys.TURN_STOP: stop, keys.TURN_INDEX: turn,
                VALIDATE_META_KEY: validate,
            })
            reply = roles.actor.generate_turn(request)
            version = int(reply.meta.get(keys.WEIGHT_VERSION, 0))
            return [
                TurnOutput(list(tokens), list(logprobs), str(reason), version)
                for tokens, logprobs, reason in zip(reply[keys.TURN_TOKEN_IDS], reply[keys.TURN_LOGPROBS], reply[keys.FINISH_REASON])
            ]

        prompts = prompt_token_lists(batch)
        with timed({} if timings is None else timings, "gen"):
            try:
                episodes = run_episodes(envs, samples, prompts, generate, self.renderer, self.loop_config, episode_keys(prompts))
            finally:
                roles.actor.release_rollout()  # the engine stayed awake across turns
        group_ids = batch[keys.GROUP_IDS].tolist() if keys.GROUP_IDS in batch else None
        metrics = episode_metrics(episodes, group_ids, self.env_class.counters, self.env_class.ratios)
        if self.env_llm is not None:
            self.first_failures = {"env LLM": self.env_llm.stats.first_error} if self.env_llm.stats.first_error else {}
            metrics |= self.env_llm.drain_metrics()
        # the episodes' prompts replace the batch's: an episode may have extended its prompt
        rest = Batch({k: v for k, v in batch.tensors.items() if k not in (keys.PROMPT_IDS, keys.PROMPT_MASK)}, batch.non_tensors, batch.meta)
        scored = rest.union(episodes_to_batch(episodes, self.config.data.max_response_length, self.tokenizer.pad_token_id))
        if validate:
            return scored.union(episode_records(episodes, self.env_class.counters)), metrics
        return self.finish_batch(scored, metrics) if whole_batch else (scored, metrics)

    def finish_batch(self, batch: Batch, metrics: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """What is decided across a whole training batch: dropping low-spread groups, then reward
        normalisation (filtering looks at the raw rewards' spread; after group normalisation every
        spread is ~1)."""
        batch, metrics = filter_groups(batch, self.config.env.filter_groups_quantile, self.batch_shape, metrics)
        return normalize_rewards(batch, self.config.env.reward_norm), metrics


def episodes_to_batch(episodes: Sequence[Episode], max_response_length: int, pad_token_id: int) -> Batch:
    """Episodes as Batch tensors: prompts re-padded (an episode may have extended its prompt),
    responses (agent + observation tokens), the loss mask, behaviour logprobs, and TOKEN_SCORES with
    each turn's reward on that turn's last token.

    Also ``reward_extra/acc`` (1.0 for a successful episode) for validation metrics, and meta
    WEIGHT_VERSION (the newest weights any turn used).
    """
    for row, episode in enumerate(episodes):
        if len(episode.response_ids) > max_response_length:
            raise ValueError(
                f"episode {row} has {len(episode.response_ids)} response tokens, more than max_response_length={max_response_length}"
            )
    width, length = max(len(e.prompt_ids) for e in episodes), max_response_length
    prompt_ids = pad_rows([e.prompt_ids for e in episodes], width, pad_token_id, left=True)
    prompt_mask = pad_rows([[1] * len(e.prompt_ids) for e in episodes], width, left=True)
    response_ids = pad_rows([e.response_ids for e in episodes], length, pad_token_id)
    attention = pad_rows([[1] * len(e.response_ids) for e in episodes], length)
    loss_mask = pad_rows([e.loss_mask for e in episodes], length)
    logprobs = pad_rows([e.logprobs for e in episodes], length, dtype=torch.float32)
    scores = torch.zeros((len(episodes), length), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        for end, reward in zip(episode.turn_ends, episode.turn_rewards):
            scores[row, end] += reward
    inputs = build_model_inputs(prompt_ids, prompt_mask, response_ids, attention)
    return Batch.from_dict(
        inputs | {
            keys.PROMPT_IDS: prompt_ids, keys.PROMPT_MASK: prompt_mask, keys.RESPONSE_MASK: loss_mask,
            keys.BEHAVIOUR_LOGPROBS: logprobs, keys.TOKEN_SCORES: scores,
        },
        {
            keys.FINISH_REASON: ["stop" if e.done and not e.out_of_tokens else "length" for e in episodes],
            "reward_extra/acc": np.array([float(e.success) for e in episodes]),
        },
        {keys.WEIGHT_VERSION: max(e.weight_version for e in episodes)},
    )


def episode_records(episodes: Sequence[Episode], counters: Sequence[str] = ()) -> Batch:
    """TRANSCRIPT and EPISODE_STATS columns: what `posttrain eval --dump-episodes` writes per episode
    (every declared counter present, 0 when the episode never reported it)."""
    stats = [
        {"num_turns": float(e.num_turns), "valid_actions": float(e.valid_actions), "forced_final": float(e.forced_final),
         "out_of_tokens": float(e.out_of_tokens), **{name: 0.0 for name in counters},
         **{name: float(value) for name, value in e.counts.items()}}
        for e in episodes
    ]
    return Batch.from_dict(non_tensors={keys.TRANSCRIPT: [e.messages() for e in episodes], keys.EPISODE_STATS: stats})


def final_token_positions(batch: Batch) -> torch.Tensor:
    """(B,) index of each row's last loss-carrying token (the final agent token); 0 for none."""
    mask = batch[keys.RESPONSE_MASK].bool()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask, positions, torch.zeros_like(positions)).max(dim=1).values


def normalize_rewards(batch: Batch, mode: str) -> Batch:
    """Episode rewards normalised by group, batch or not at all; the change lands on the final agent token."""
    if mode == "none":
        return batch
    scores = batch[keys.TOKEN_SCORES].clone()
    episode = scores.sum(-1)
    normalized = normalize_episode_rewards(episode, mode, batch[keys.GROUP_IDS] if keys.GROUP_IDS in batch else None)
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
    while groups and (groups * shape.group_size) % shape.ranks:
        groups -= 1
    return groups


def filter_groups(batch: Batch, quantile: float, shape: UpdateBatchShape, metrics: dict[str, float]) -> tuple[Batch, dict[str, float]]:
    """Drop the groups whose reward spread is below ``quantile`` of the batch's (0: keep all).

    The kept groups are then trimmed, lowest spread first, to a count the update can split
    (:func:`kept_group_count`); if no count works, the whole batch is kept.
    """
    if quantile == 0.0:
        return batch, metrics
    rewards, group_ids = batch[keys.TOKEN_SCORES].sum(-1), batch[keys.GROUP_IDS]
    keep = groups_with_spread(rewards, group_ids, quantile)
    kept = sorted({int(g) for g in group_ids[keep]}, key=lambda g: -rewards[group_ids == g].std(unbiased=False).item())
    kept = kept[: kept_group_count(len(kept), shape)]
    if not kept:
        return batch, metrics | {"agent/groups_kept_ratio": 1.0}
    keep = torch.isin(group_ids, torch.tensor(kept, dtype=group_ids.dtype))
    metrics = metrics | {"agent/groups_kept_ratio": keep.float().mean().item()}
    return batch.index(torch.nonzero(keep).squeeze(1)), metrics


def episode_keys(prompts: Sequence[Sequence[int]]) -> list[str]:
    """A stable key per episode: its prompt's hash and its place among the rows with that prompt."""
    seen: dict[str, int] = {}
    keys_ = []
    for prompt in prompts:
        digest = hashlib.sha256(np.asarray(prompt, dtype=np.int64).tobytes()).hexdigest()[:16]
        seen[digest] = seen.get(digest, -1) + 1
        keys_.append(f"{digest}-{seen[digest]}")
    return keys_
