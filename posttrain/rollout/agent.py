"""Multi-turn rollouts: episodes in ``env.name``'s environment, rewards from the environment.

    AgentRollout   the agent loop (agents/loop.py) driving actor.generate_turn → environment rewards

For an agent episode the "response" is everything after the prompt: agent turns and observations.
RESPONSE_MASK (the loss mask) is 1 on agent tokens only; the attention mask covers both, so the
policy sees the observations but is never trained to produce them. The tokens trained are the
tokens sampled: episodes grow by appending token ids, never by re-tokenising text.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from posttrain import keys
from posttrain.agents import (
    AgentLoopConfig, Environment, Episode, EpisodeSample, GenerateTurn, ObservationRenderer, TurnOutput, episode_metrics, run_episodes,
)
from posttrain.agents.env_llm import EnvLLMClient
from posttrain.config.schema import PosttrainConfig
from posttrain.data import RLDataset
from posttrain.errors import InputError
from posttrain.models import resolve_model
from posttrain.models.tool_formats import format_class
from posttrain.metrics import Metrics
from posttrain.protocol import Batch
from posttrain.rollout.batching import prompt_token_lists, sequences_to_batch
from posttrain.rollout.env_llm import open_env_llm
from posttrain.rollout.environments import env_factory, load_env_class, probe_environment, wanted_resources
from posttrain.rollout.groups import filter_groups, normalize_rewards, update_batch_shape
from posttrain.rollout.retriever import RetrieverHandle, corpus_path, open_retriever
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.scoring import open_judge, reward_manager_for, score_episode_answers
from posttrain.rollout.toolbox import needs_retriever, open_toolbox, sample_checker, uses_tools
from posttrain.timing import timed
from posttrain.tools import ToolBox
from posttrain.tools.builtin import RETRIEVER_URL_VAR
from posttrain.workers.sampling import VALIDATE_META_KEY


SEED_TURNS_RANGE = (2, 10)  # env.max_turns=-1: each episode's budget drawn from it (DoctorAgent-RL's dynamic turns)


class AgentRollout:
    """Multi-turn episodes in ``env.name``'s environment; rewards come from the environment."""

    def __init__(self, config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None) -> None:
        env = config.env
        self.config, self.tokenizer, self.data_dir = config, tokenizer, data_dir
        self.env_class = load_env_class(env.name, env.path, env.class_name)
        role = env.observation_role
        if uses_tools(env):  # results go back in the role the tool format says (a tool message for the template's own)
            role = format_class(env.tool_format, tokenizer).observation_role
        self.renderer = ObservationRenderer(tokenizer, role)
        drawn = tuple(env.turns_range) if env.turns_range else (SEED_TURNS_RANGE if env.max_turns == -1 else None)
        self.loop_config = AgentLoopConfig(
            max_response_length=config.data.max_response_length, max_turns=max(env.max_turns, 0),
            turns_range=drawn, max_turn_tokens=env.max_turn_tokens,
            max_obs_length=env.max_obs_length, seed=config.trainer.seed,
        )
        self.resources = wanted_resources(self.env_class, env.options) | ({"retriever"} if needs_retriever(env) else set())
        probe = probe_environment(self.env_class, env.options)
        self.stop_strings = probe.stop_strings  # what ends an agent turn inside the engine
        if "retriever" in self.resources and not env.retriever.url:
            corpus_path(env.retriever, data_dir)
        if "env_llm" in self.resources and not env.llm.url:
            resolve_model(env.llm.model_path)  # a missing model fails here, not in a worker
        self.retriever: RetrieverHandle | None = None
        self.env_llm: EnvLLMClient | None = None
        self.toolbox: ToolBox | None = None
        self.make_env: Callable[[], Environment] | None = None
        self.opened: dict[str, object] = {}  # the shared resources open now, by name
        self.batch_shape = update_batch_shape(config)
        self.reward_manager = reward_manager_for(config, tokenizer)  # scores the answers episodes hand over
        self.first_failures: dict[str, str] = {}  # of the last rollout, by circuit breaker (trainer/breakers.py)

    def check_data(self, **datasets: RLDataset | None) -> None:
        """Refuse, before any worker starts, a prompt the environment cannot play (its ``check_sample``;
        for a tool environment, its check with the run's tools: rollout/toolbox.py ``sample_checker``)."""
        options = self.config.env.options
        by_data_source = self.config.custom_reward_function.path is None  # else a custom function scores every row
        check = sample_checker(self.config.env, by_data_source) if uses_tools(self.config.env) else \
            lambda row: self.env_class.check_sample(row, options)
        for split, dataset in datasets.items():
            for index, sample in enumerate(dataset.samples if dataset is not None else ()):
                try:
                    check(EpisodeSample(list(sample.messages), sample.ground_truth, sample.data_source, dict(sample.extra_info or {})))
                except ValueError as error:
                    raise InputError(f"{split} prompt {index}: {error}") from None

    def open(self, roles: RolloutRoles) -> None:
        """Connect the resources the environment asks for: the retriever (started for the run, or
        at env.retriever.url), the Env-LLM (the run's worker, or env.llm.url) and the tools."""
        resources: dict[str, object] = {}
        if "retriever" in self.resources:
            self.retriever = open_retriever(self.config.env.retriever, self.data_dir)
            resources["retriever"] = self.retriever.client
            os.environ[RETRIEVER_URL_VAR] = self.retriever.client.url  # for the built-in search tool's calls
        if "env_llm" in self.resources:
            self.env_llm = open_env_llm(self.config.env.llm, roles.env_llm)
            resources["env_llm"] = self.env_llm
        if "toolbox" in self.resources:
            self.toolbox = open_toolbox(self.config.env, self.tokenizer)
            resources["toolbox"] = self.toolbox
        self.make_env = env_factory(self.env_class, self.config.env.options, resources)
        self.opened = resources
        open_judge(self.reward_manager, roles)

    def before_training(self, samples: Iterable[EpisodeSample]) -> None:
        """The environment's own check before step 1 (its class's ``before_training``, e.g. the
        doctor's patient probe), with the resources :meth:`open` connected."""
        self.env_class.before_training(self.config.env, self.opened, samples)

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
            self.retriever = None
        if self.env_llm is not None:
            self.env_llm.close()
            self.env_llm = None
        if self.toolbox is not None:
            self.toolbox.close()
            self.toolbox = None
        self.reward_manager.close()
        self.make_env, self.opened = None, {}

    def __call__(
        self, roles: RolloutRoles, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None,
        whole_batch: bool = True,
    ) -> tuple[Batch, Metrics]:
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

        generate = turn_call(roles, validate)
        prompts = prompt_token_lists(batch)
        with timed({} if timings is None else timings, "gen"):
            try:
                rows = episode_keys(batch[keys.RAW_PROMPT])
                episodes = run_episodes(envs, samples, prompts, generate, self.renderer, self.loop_config, rows, sampling_keys(batch, rows))
            finally:
                roles.actor.release_rollout()  # the engine stayed awake across turns
        with timed({} if timings is None else timings, "reward"):
            reward_metrics, reward_failure = score_episode_answers(self.reward_manager, episodes, samples)
        group_ids = batch[keys.GROUP_IDS].tolist() if keys.GROUP_IDS in batch else None
        metrics = episode_metrics(episodes, group_ids, self.env_class.counters, self.env_class.ratios) | reward_metrics
        self.first_failures = {"reward": reward_failure} if reward_failure else {}
        if self.env_llm is not None:
            if self.env_llm.stats.first_error:
                self.first_failures["env LLM"] = self.env_llm.stats.first_error
            metrics |= self.env_llm.drain_metrics()
        # the episodes' prompts replace the batch's: an episode may have extended its prompt
        rest = Batch({k: v for k, v in batch.tensors.items() if k not in (keys.PROMPT_IDS, keys.PROMPT_MASK)}, batch.non_tensors, batch.meta)
        scored = rest.union(episodes_to_batch(episodes, self.config.data.max_response_length, self.tokenizer.pad_token_id))
        scored = scored.union(episode_records(episodes, self.env_class.counters))  # what validation and the rollout dump write
        if validate:
            return scored, metrics
        return self.finish_batch(scored, metrics) if whole_batch else (scored, metrics)

    def finish_batch(self, batch: Batch, metrics: Metrics) -> tuple[Batch, Metrics]:
        """What is decided across a whole training batch: dropping low-spread groups, then reward
        normalisation (filtering looks at the raw rewards' spread; after group normalisation every
        spread is ~1). A batch whose retriever died under it is not trained on (:class:`ServiceDiedError`)."""
        if self.retriever is not None:
            self.retriever.check_alive()
        batch, metrics = filter_groups(batch, self.config.env.filter_groups_quantile, self.batch_shape, metrics)
        return normalize_rewards(batch, self.config.env.reward_norm), metrics


def turn_call(roles: RolloutRoles, validate: bool) -> GenerateTurn:
    """The agent loop's engine call (:data:`~posttrain.agents.GenerateTurn`) on ``roles.actor.generate_turn``:
    one request for the contexts, one :class:`TurnOutput` back for each (with the weight version)."""

    def generate(contexts: Sequence[Sequence[int]], max_new_tokens: int, stop: tuple[str, ...], request_keys: Sequence[str]) -> list[TurnOutput]:
        request = Batch.from_dict(non_tensors={keys.TURN_CONTEXT_IDS: [list(c) for c in contexts], keys.TURN_REQUEST_KEYS: list(request_keys)},
                                  meta={keys.TURN_MAX_NEW_TOKENS: max_new_tokens, keys.TURN_STOP: stop, VALIDATE_META_KEY: validate})
        reply = roles.actor.generate_turn(request)
        version = int(reply.meta.get(keys.WEIGHT_VERSION, 0))
        return [TurnOutput(list(tokens), list(logprobs), str(reason), version)
                for tokens, logprobs, reason in zip(reply[keys.TURN_TOKEN_IDS], reply[keys.TURN_LOGPROBS], reply[keys.FINISH_REASON])]

    return generate


def episodes_to_batch(episodes: Sequence[Episode], max_response_length: int, pad_token_id: int) -> Batch:
    """Episodes as Batch tensors: prompts re-padded (an episode may have extended its prompt),
    responses (agent + observation tokens), the loss mask, behaviour logprobs, and TOKEN_SCORES with
    each turn's reward on that turn's last token.

    Also ``reward_extra/acc`` (1.0 for a successful episode) for validation metrics, and meta
    WEIGHT_VERSION (the newest weights any turn used).
    """
    batch = sequences_to_batch(
        [e.prompt_ids for e in episodes], [e.response_ids for e in episodes], pad_token_id=pad_token_id,
        response_width=max_response_length, loss_masks=[e.loss_mask for e in episodes], logprobs=[e.logprobs for e in episodes],
    )
    scores = torch.zeros((len(episodes), max_response_length), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        for end, reward in zip(episode.turn_ends, episode.turn_rewards):
            scores[row, end] += reward
    batch.tensors[keys.TOKEN_SCORES] = scores
    batch.non_tensors[keys.FINISH_REASON] = np.array(["stop" if e.done and not e.out_of_tokens else "length" for e in episodes], dtype=object)
    batch.non_tensors["reward_extra/acc"] = np.array([float(e.success) for e in episodes])
    batch.meta[keys.WEIGHT_VERSION] = max(e.weight_version for e in episodes)
    return batch


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


def episode_keys(raw_prompts: Sequence[Any]) -> list[str]:
    """A stable key per episode: its row's chat messages (RAW_PROMPT) hashed, and its place among the rows
    with those messages. The messages, not the token ids, so a program (whose prompt tells no tools until it
    asks) and the built-in agent give the same row the same key, and with it the same sampling seeds."""
    seen: dict[str, int] = {}
    keys_ = []
    for prompt in raw_prompts:
        digest = hashlib.sha256(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()[:16]
        seen[digest] = seen.get(digest, -1) + 1
        keys_.append(f"{digest}-{seen[digest]}")
    return keys_


def sampling_keys(batch: Batch, episodes: Sequence[str] | None = None) -> list[str]:
    """Each episode's sampling key (its requests are ``"<key>:<turn>"``): its row's UID (the dataset row and the
    draw that read it) and its :func:`episode_keys` key (``episodes``, when already made). Two rows with the same
    messages in one step (another generator unit, another dynamic-sampling round) sample apart; a program and the
    built-in agent, given the same batch, sample alike."""
    episodes = episode_keys(batch[keys.RAW_PROMPT]) if episodes is None else list(episodes)
    if keys.UID not in batch.non_tensors:
        return episodes
    return [f"{uid}/{key}" for uid, key in zip(batch[keys.UID], episodes)]
