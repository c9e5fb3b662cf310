"""A user's own agent program as the rollout (``env.name: program``, docs/programs.md).

    ProgramRollout   each row of the batch: one run of the program (agents/program_host.py) against the
                     run's endpoint (rollout/endpoint.py), recorded token by token (agents/program.py)

For every row the program gets a base URL of its own and the row; the endpoint answers its chat
requests from the policy's engine (``actor.generate_turn``, the agent loop's call, gathered across
episodes) and records what the engine saw and sampled. When every run has ended (or its deadline
passed), the episodes are closed and become rows:

- **training**: one row per sample. An episode whose requests extended each other is one sample; each
  prefix break adds one. The samples of an episode share its score (on each one's last sampled token)
  and an ``EPISODE_IDS`` entry, so group statistics count the episode once (``algos.per_episode``,
  ``normalize_rewards``), and the update makes as many optimizer steps as whole groups ask
  (meta ``GROUP_COUNT``, trainer/learn.py). An episode that never asked anything (its program failed
  first) is one row with no response tokens: it trains nothing, and its score 0 still counts in its group.
- **validation**: one row per episode, its last sample, so accuracy is over episodes.

The score is what the program returned (``program_score``); ``None`` leaves it to the row's score
function on the last reply's text (the one reward path, rollout/scoring.py), as the tool agent hands
over its final turn. A program that raised, hung past ``deadline_s`` or died scores 0 and is counted
(``program/errors``, ``program/timeouts``); the run goes on.

Metrics: ``agent/success_rate`` (over episodes, as the agent loop's), ``program/samples_per_episode``, ``program/prefix_breaks``, ``program/requests``,
``program/refused``, ``program/engine_errors``, ``program/sampling_ignored``, ``program/context_full``,
``program/errors``, ``program/timeouts``, ``program/no_request`` and the reward path's own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from posttrain import keys
from posttrain.agents import Episode, EpisodeSample, TurnOutput
from posttrain.agents.program import ProgramEpisode
from posttrain.agents.program_host import ProgramEnv, ProgramHost, program_score
from posttrain.config.schema import PosttrainConfig
from posttrain.deadlines import CallOutcome
from posttrain.metrics import Metrics, mean, total
from posttrain.models.tool_formats import make_tool_format
from posttrain.protocol import Batch
from posttrain.rewards.manager import Answer
from posttrain.rollout.agent import episodes_to_batch, sampling_keys, turn_call
from posttrain.rollout.batching import prompt_token_lists
from posttrain.rollout.endpoint import EndpointSettings, ProgramEndpoint, episode_counts
from posttrain.rollout.environments import load_env_class, probe_environment
from posttrain.rollout.groups import filter_groups, normalize_rewards, update_batch_shape
from posttrain.rollout.retriever import RetrieverHandle, corpus_path, open_retriever
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.scoring import open_judge, reward_manager_for, success_of
from posttrain.timing import timed
from posttrain.tools.builtin import RETRIEVER_URL_VAR

ENGINE_CALL_WAIT_S = 600.0  # after the episodes end, how long an engine call still under way may take
MODEL_NAME = "policy"  # what /v1/models lists; a request naming another model is served by the policy and counted


class ProgramRollout:
    """Runs of the user's program, one per row, scored (module docstring)."""

    def __init__(self, config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None) -> None:
        env = config.env
        self.config, self.tokenizer, self.data_dir = config, tokenizer, data_dir
        self.env_class = load_env_class(env.name, env.path, env.class_name)
        options = probe_environment(self.env_class, env.options)  # a bad entry or option is refused here
        assert isinstance(options, ProgramEnv)
        self.options = options
        self.tool_format = make_tool_format(env.tool_format, tokenizer)
        self.settings = EndpointSettings(
            model=MODEL_NAME, max_turn_tokens=env.max_turn_tokens, max_response_length=config.data.max_response_length,
            gather_s=options.gather_s, refuse_other_sampling=options.refuse_other_sampling,
            max_context_tokens=config.data.max_prompt_length + config.data.max_response_length,
        )
        self.batch_shape = update_batch_shape(config)
        self.reward_manager = reward_manager_for(config, tokenizer)
        if options.use_retriever and not env.retriever.url:
            corpus_path(env.retriever, data_dir)  # a missing corpus fails here, not in the first step
        self.retriever: RetrieverHandle | None = None
        self.endpoint: ProgramEndpoint | None = None
        self.host: ProgramHost | None = None
        self._serving: Any = None
        self._roles: RolloutRoles | None = None
        self._validate = False
        self.first_failures: dict[str, str] = {}

    def check_data(self, **datasets: Any) -> None:
        """Any row can be given to a program."""

    def open(self, roles: RolloutRoles) -> None:
        """Serve the endpoint (a thread of this process), open the retriever if the options ask for it
        (its URL in ``$POSTTRAIN_RETRIEVER_URL`` for the programs), and start the programs' host."""
        self._roles = roles
        if self.options.use_retriever:
            self.retriever = open_retriever(self.config.env.retriever, self.data_dir)
            os.environ[RETRIEVER_URL_VAR] = self.retriever.client.url  # inherited by the host and every episode
        self.endpoint = ProgramEndpoint(self._generate, self.tokenizer, self.tool_format, self.settings)
        self._serving = self.endpoint.serving()
        self._serving.__enter__()
        self.host = ProgramHost(self.options.entry, self.options.command)
        self.host.start()
        open_judge(self.reward_manager, roles)

    def before_training(self, samples: Any) -> None:
        """A program has no check of its own before step 1."""

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None
        if self.retriever is not None:
            self.retriever.close()
            self.retriever = None
            os.environ.pop(RETRIEVER_URL_VAR, None)
        if self._serving is not None:
            self._serving.__exit__(None, None, None)
            self._serving, self.endpoint = None, None
        self.reward_manager.close()
        self._roles = None

    def _generate(self, contexts: Sequence[Sequence[int]], max_new_tokens: int, stop: tuple[str, ...], request_keys: Sequence[str]) -> list[TurnOutput]:
        """The endpoint's engine call: the agent loop's (``turn_call``), on the roles of the rollout under way."""
        if self._roles is None:
            raise RuntimeError("ProgramRollout.open(roles) must be called before rollouts")
        return turn_call(self._roles, self._validate)(contexts, max_new_tokens, stop, request_keys)

    def __call__(
        self, roles: RolloutRoles, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None,
        whole_batch: bool = True,
    ) -> tuple[Batch, Metrics]:
        """One run of the program per row of ``batch``, scored; ``whole_batch=False`` (a part of a training
        batch, as an asynchronous generator makes it) leaves :meth:`finish_batch` to whoever joins the parts."""
        if self.endpoint is None or self.host is None:
            raise RuntimeError("ProgramRollout.open(roles) must be called before rollouts (it serves the endpoint)")
        self._roles, self._validate = roles, validate
        samples = [EpisodeSample(list(prompt), truth, str(source), dict(extra or {})) for prompt, truth, source, extra in zip(
            batch[keys.RAW_PROMPT], batch[keys.GROUND_TRUTH], batch[keys.DATA_SOURCE], batch[keys.EXTRA_INFO])]
        names = [uuid.uuid4().hex[:16] for _ in samples]
        prompts = prompt_token_lists(batch)
        timings = {} if timings is None else timings
        with timed(timings, "gen"):  # each episode sampled under the built-in agent loop's key for its row
            urls = [self.endpoint.open(name, seed_key) for name, seed_key in zip(names, sampling_keys(batch))]
            closed: dict[int, ProgramEpisode] = {}

            def ended(index: int) -> None:  # closed as its program ends: the endpoint stops waiting for its requests
                closed[index] = self.endpoint.close(names[index])

            try:
                outcomes = self.host.run([(url, program_row(sample)) for url, sample in zip(urls, samples)], self.options.deadline_s, ended)
            finally:
                episodes = [closed[index] if index in closed else self.endpoint.close(name) for index, name in enumerate(names)]
                self.endpoint.idle.wait(ENGINE_CALL_WAIT_S)  # an engine call begun before the episodes closed ends first
                roles.actor.release_rollout()  # the engine stayed awake across the requests
        with timed(timings, "reward"):
            scores, successes, metrics = self.score(episodes, outcomes, samples)
        metrics |= self.counts(episodes, outcomes) | {"agent/success_rate": mean(float(np.mean(successes)), len(successes))}
        rows = episode_rows(episodes, prompts, scores, self.config.data.max_response_length, last_only=validate)
        scored = self.to_batch(batch, episodes, rows, successes, names)
        if validate:
            return scored, metrics
        return self.finish_batch(scored, metrics) if whole_batch else (scored, metrics)

    def score(self, episodes: Sequence[ProgramEpisode], outcomes: Sequence[CallOutcome],
              samples: Sequence[EpisodeSample]) -> tuple[list[float], list[bool], Metrics]:
        """Each episode's score and success: the program's return, else the row's score function on the
        last reply's text (module docstring)."""
        scores, successes = [0.0] * len(episodes), [False] * len(episodes)
        judged: list[int] = []
        for row, outcome in enumerate(outcomes):
            if outcome.error is not None or outcome.timed_out or outcome.died:
                continue
            score, acc = program_score(outcome.value)
            if score is None:
                if episodes[row].last_reply is not None:
                    judged.append(row)
                continue
            scores[row], successes[row] = score, success_of(score, acc)
        self.first_failures = {}
        if not judged:
            return scores, successes, {}
        scored = self.reward_manager.score([Answer(episodes[row].last_reply.text, samples[row].ground_truth, samples[row].data_source,
                                                   dict(samples[row].extra_info), prompt=samples[row].prompt) for row in judged])
        acc = scored.extra.get("acc")
        for index, row in enumerate(judged):
            scores[row] = float(scored.scores[index])
            successes[row] = success_of(scores[row], None if acc is None else acc[index])
        if scored.first_failure:
            self.first_failures["reward"] = scored.first_failure
        return scores, successes, dict(scored.metrics)

    def counts(self, episodes: Sequence[ProgramEpisode], outcomes: Sequence[CallOutcome]) -> Metrics:
        """The ``program/*`` metrics of this rollout (module docstring)."""
        n = len(episodes)
        assert self.endpoint is not None
        metrics: Metrics = {name: mean(value, n) for name, value in episode_counts(episodes).items()}
        metrics |= {name: total(value) for name, value in self.endpoint.drain_counts().items()}
        metrics |= {
            "program/errors": total(sum(o.error is not None and not o.timed_out for o in outcomes)),
            "program/timeouts": total(sum(bool(o.timed_out) for o in outcomes)),
            "program/no_request": total(sum(not e.samples for e in episodes)),
            "agent/episodes": total(n),
        }
        first_error = next((o.error for o in outcomes if o.error), None)
        if first_error:
            self.first_failures.setdefault("program", first_error)
        return metrics

    def to_batch(self, batch: Batch, episodes: Sequence[ProgramEpisode], rows: list[tuple[int, Episode]],
                 successes: Sequence[bool], names: Sequence[str]) -> Batch:
        """The episodes' rows, each with its batch row's columns (uid, data source, ...)."""
        source = torch.tensor([row for row, _ in rows], dtype=torch.long)
        rest = Batch({k: v for k, v in batch.tensors.items() if k not in (keys.PROMPT_IDS, keys.PROMPT_MASK)}, batch.non_tensors, batch.meta)
        made = episodes_to_batch([sample for _, sample in rows], self.config.data.max_response_length, self.tokenizer.pad_token_id)
        made.non_tensors["reward_extra/acc"] = np.array([float(successes[row]) for row, _ in rows])
        # an episode that spans weight versions counts as its oldest for the staleness bound
        versions = [episodes[row].oldest_version for row, _ in rows if episodes[row].oldest_version is not None]
        made.meta[keys.WEIGHT_VERSION] = min(versions, default=0)
        records = Batch.from_dict(non_tensors={
            keys.EPISODE_IDS: [names[row] for row, _ in rows],
            keys.TRANSCRIPT: [episodes[row].transcript() for row, _ in rows],
            keys.EPISODE_STATS: [{"num_turns": float(episodes[row].requests), "samples": float(len(episodes[row].samples)),
                                  "prefix_breaks": float(episodes[row].prefix_breaks)} for row, _ in rows],
        })
        return rest.index(source).union(made).union(records)

    def finish_batch(self, batch: Batch, metrics: Metrics) -> tuple[Batch, Metrics]:
        """What is decided across a whole training batch: dropping low-spread groups, then reward
        normalisation. A batch whose retriever died under it is not trained on (:class:`ServiceDiedError`)."""
        if self.retriever is not None:
            self.retriever.check_alive()
        batch, metrics = filter_groups(batch, self.config.env.filter_groups_quantile, self.batch_shape, metrics)
        return normalize_rewards(batch, self.config.env.reward_norm), metrics


def program_row(sample: EpisodeSample) -> dict[str, Any]:
    """What the program gets as ``row``: the prompt's messages, the ground truth, the data source, the extras."""
    return {"messages": list(sample.prompt), "ground_truth": sample.ground_truth, "data_source": sample.data_source,
            "extra_info": dict(sample.extra_info)}


def episode_rows(episodes: Sequence[ProgramEpisode], prompts: Sequence[Sequence[int]], scores: Sequence[float],
                 max_response_length: int, *, last_only: bool = False) -> list[tuple[int, Episode]]:
    """(batch row, sample) pairs: each episode's samples (its last only, ``last_only``), each carrying the
    episode's score on its last sampled token; an episode with none, its prompt with no response."""
    rows: list[tuple[int, Episode]] = []
    for row, episode in enumerate(episodes):
        samples = episode.samples[-1:] if last_only else episode.samples
        if not samples:  # no tokens to train; its score sits on the first place, so its group still counts it
            rows.append((row, Episode(prompt_ids=list(prompts[row]), turn_budget=0, response_budget=max_response_length,
                                      turn_ends=[0], turn_rewards=[float(scores[row])])))
            continue
        for sample in samples:
            sample.turn_rewards = [0.0] * len(sample.turn_ends)
            sample.turn_rewards[-1] = float(scores[row])
            rows.append((row, sample))
    return rows
