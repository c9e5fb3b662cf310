"""The batched multi-turn agent loop.

All live episodes advance together, one agent turn per round:

    generate   one call to the rollout engine for the live episodes only (their whole context so
               far as token ids); stop strings such as ``</search>`` end a turn inside the engine
    step       the environments read the turn's text (decoded only for them) and answer; one
               ``step_batch`` call per environment class, so a service sees one request per round
    append     the agent's tokens exactly as sampled, loss mask 1 and their behaviour logprobs;
               the observation rendered as a chat turn, loss mask 0 (render.py)

An episode ends when its environment says done, when its response budget (``max_response_length``
tokens of agent text and observations together) cannot hold another observation and a full turn of
``max_turn_tokens`` (observations are cut to leave that room), or after its turn budget: an episode that
used ``max_turns`` turns without finishing is shown the environment's final-turn instruction and
gets one last turn whose action ends it (``Environment.finish``). With a budget of 0 turns, the
instruction is added to the prompt and the only turn is that final one. Each environment is closed
(``Environment.close``) in the round its episode ends, and every one left when the loop stops.

Each step's reward lands on the last token of the agent turn that earned it (episode rewards on
the final agent token, per-turn rewards on each turn's last token). Token lists, masks and logprobs
are built at append time, so they line up token by token with what the engine produced and what
the environment returned; nothing is re-tokenised afterwards.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.agents.env import EpisodeAnswer, EpisodeSample, Environment, StepResult
from posttrain.agents.render import ObservationRenderer


@dataclass(frozen=True)
class TurnOutput:
    """One agent turn as the rollout engine sampled it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    weight_version: int = 0


def turn_logprobs(tokens: Sequence[int], logprobs: Sequence[float] | None) -> list[float]:
    """The engine's behaviour logprobs for ``tokens``, the first of the response it sampled (any past them cut off).
    ValueError when it returned fewer, or none (params that asked for no logprobs): a missing one padded with 0 would
    read as probability 1 to the importance weights."""
    if logprobs is None or len(logprobs) < len(tokens):
        raise ValueError(f"the rollout engine returned {0 if logprobs is None else len(logprobs)} logprobs for {len(tokens)} "
                         "tokens; ask it for logprobs")
    return list(logprobs[: len(tokens)])


# (contexts as token ids, max new tokens, stop strings, request keys) -> one TurnOutput per context. A request's
# key, "<episode key>:<turn>", seeds its sampling (workers/sampling.py), whatever else the call holds.
GenerateTurn = Callable[[Sequence[Sequence[int]], int, tuple[str, ...], Sequence[str]], list[TurnOutput]]


@dataclass(frozen=True)
class AgentLoopConfig:
    max_response_length: int            # agent tokens + observation tokens after the prompt
    max_turns: int = 4                  # ordinary turns before the forced final one
    turns_range: tuple[int, int] | None = None  # draw each episode's max_turns from [low, high]
    max_turn_tokens: int = 128          # new tokens per agent turn
    max_obs_length: int = 256           # tokens of one rendered observation
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.max_turns < 0:
            problems.append(f"max_turns={self.max_turns} must be >= 0")
        if self.turns_range is not None and not 0 <= self.turns_range[0] <= self.turns_range[1]:
            problems.append(f"turns_range={list(self.turns_range)} must be [low, high] with 0 <= low <= high")
        for name in ("max_response_length", "max_turn_tokens", "max_obs_length"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if problems:
            raise ValueError("invalid agent loop settings: " + "; ".join(problems))


@dataclass
class Episode:
    """One episode's tokens after the prompt, with a loss-mask entry and a logprob per token."""

    prompt_ids: list[int]
    turn_budget: int
    response_budget: int
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)      # 1 on agent tokens, 0 on observations
    logprobs: list[float] = field(default_factory=list)     # behaviour logprobs; 0 on observations
    turn_starts: list[int] = field(default_factory=list)    # index of each agent turn's first token
    turn_ends: list[int] = field(default_factory=list)      # index of each agent turn's last token
    turn_rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)   # the text shown after each non-final turn
    prompt_messages: list[dict[str, str]] = field(default_factory=list)  # the chat prompt, as extended at reset
    valid_actions: int = 0
    effective_actions: int = 0
    success: bool = False
    done: bool = False
    in_final_turn: bool = False
    forced_final: bool = False
    out_of_tokens: bool = False
    observations_truncated: int = 0
    counts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    weight_version: int = 0
    observation_role: str = "user"
    answer: EpisodeAnswer | None = None  # the answer the reward path scores, and the turn its score goes to
    answer_turn: int = -1

    @property
    def num_turns(self) -> int:
        return len(self.turn_ends)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def room(self) -> int:
        return self.response_budget - len(self.response_ids)

    @property
    def last_turn_ids(self) -> list[int]:
        return self.response_ids[self.turn_starts[-1] : self.turn_ends[-1] + 1]

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def messages(self) -> list[dict[str, str]]:
        """The episode as chat messages (prompt, then agent turns and observations): the layout
        ``posttrain sft`` reads, so successful episodes can be imitated (rejection-sampling fine-tuning)."""
        turns: list[dict[str, str]] = []
        for i, action in enumerate(self.actions):
            turns.append({"role": "assistant", "content": action})
            if i < len(self.observations):
                turns.append({"role": self.observation_role, "content": self.observations[i]})
        return [*self.prompt_messages, *turns]

    def append_agent_turn(self, turn: TurnOutput) -> None:
        tokens = turn.token_ids[: self.room]  # the engine may overshoot the budget; keep what fits
        logprobs = turn_logprobs(tokens, turn.logprobs)
        self.turn_starts.append(len(self.response_ids))
        self.response_ids += tokens
        self.loss_mask += [1] * len(tokens)
        self.logprobs += logprobs
        self.turn_ends.append(len(self.response_ids) - 1)
        self.weight_version = max(self.weight_version, turn.weight_version)

    def append_observation(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)

    def record(self, result: StepResult) -> None:
        self.turn_rewards.append(float(result.reward))
        self.valid_actions += int(result.info.valid)
        self.effective_actions += int(result.info.effective)
        self.success = self.success or result.info.success
        for name, value in result.info.counts.items():
            self.counts[name] += float(value)
        self.done = self.done or result.done
        if result.answer is not None:
            self.answer, self.answer_turn = result.answer, len(self.turn_rewards) - 1


def turn_budgets(episode_keys: Sequence[str], config: AgentLoopConfig) -> list[int]:
    """Each episode's ``max_turns``: the fixed value, or drawn from ``turns_range``.

    A drawn budget depends only on ``config.seed`` and the episode's key (e.g. its prompt and its
    place in the group), so a resumed run, and every validation, draws the same budgets again.
    """
    if config.turns_range is None:
        return [config.max_turns] * len(episode_keys)
    low, high = config.turns_range
    return [random.Random(f"{config.seed}:{key}").randint(low, high) for key in episode_keys]


def run_episodes(
    envs: Sequence[Environment],
    samples: Sequence[EpisodeSample],
    prompt_ids: Sequence[Sequence[int]],
    generate: GenerateTurn,
    renderer: ObservationRenderer,
    config: AgentLoopConfig,
    episode_keys: Sequence[str] | None = None,
    sampling_keys: Sequence[str] | None = None,
) -> list[Episode]:
    """Play one episode per environment to the end; returns them in input order.

    ``episode_keys`` seed the turn budgets drawn from ``turns_range`` (default: the positions);
    ``sampling_keys`` (default: ``episode_keys``), with the turn, name each request, which seeds its sampling.
    """
    if not len(envs) == len(samples) == len(prompt_ids):
        raise ValueError(f"{len(envs)} environments, {len(samples)} samples and {len(prompt_ids)} prompts: give one of each per episode")
    episode_keys = [str(i) for i in range(len(envs))] if episode_keys is None else list(episode_keys)
    sampling_keys = episode_keys if sampling_keys is None else list(sampling_keys)
    budgets = turn_budgets(episode_keys, config)
    episodes: list[Episode] = []
    closed: set[int] = set()
    try:
        for env, sample, prompt, budget in zip(envs, samples, prompt_ids, budgets):
            episodes.append(_start(env, sample, list(prompt), budget, renderer, config))
        stop = tuple(dict.fromkeys(s for env in envs for s in env.stop_strings))
        turn = 0
        while live := [i for i, episode in enumerate(episodes) if not episode.done]:
            _close_ended(envs, episodes, closed)
            outputs = generate([episodes[i].context for i in live], config.max_turn_tokens, stop, [f"{sampling_keys[i]}:{turn}" for i in live])
            if len(outputs) != len(live):
                raise ValueError(f"the rollout engine returned {len(outputs)} turns for {len(live)} live episodes")
            for i, output in zip(live, outputs):
                episodes[i].append_agent_turn(output)
            results = _step(envs, episodes, live, renderer.tokenizer)
            for i, result in zip(live, results):
                episode = episodes[i]
                episode.record(result)
                if episode.in_final_turn:
                    episode.done = True
                if not episode.done:
                    _continue(episode, envs[i], result, renderer, config)
            turn += 1
    finally:  # the episodes that ended, and any the loop left unfinished (an error)
        for i, env in enumerate(envs):
            if i not in closed:
                env.close()
    return episodes


def _close_ended(envs: Sequence[Environment], episodes: Sequence[Episode], closed: set[int]) -> None:
    """Close the environments of the episodes that have ended and are not closed yet."""
    for i, episode in enumerate(episodes):
        if episode.done and i not in closed:
            closed.add(i)
            envs[i].close()


def _start(
    env: Environment, sample: EpisodeSample, prompt: list[int], budget: int, renderer: ObservationRenderer, config: AgentLoopConfig,
) -> Episode:
    """Reset the environment; an observation from reset, or a zero turn budget, extends the prompt."""
    env.turn_budget = budget
    extra = [text for text in (env.reset(sample), env.final_turn_instruction() if budget == 0 else "") if text]
    messages = list(sample.prompt)
    if extra:
        messages += [{"role": renderer.role, "content": text} for text in extra]
        extended = list(renderer.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        # The added messages come out of the response budget, so prompt + response still fits the engine.
        response_budget = config.max_response_length - max(len(extended) - len(prompt), 0)
        prompt = extended
    else:
        response_budget = config.max_response_length
    episode = Episode(prompt_ids=prompt, turn_budget=budget, response_budget=response_budget,
                      prompt_messages=messages, observation_role=renderer.role)
    episode.in_final_turn = episode.forced_final = budget == 0
    if response_budget < 1:
        episode.done = episode.out_of_tokens = True
    return episode


def _step(envs: Sequence[Environment], episodes: list[Episode], live: list[int], tokenizer: Any) -> list[StepResult]:
    """Step the live episodes: final turns through ``finish``, the rest batched per environment class."""
    results: dict[int, StepResult] = {}
    batched: dict[type, list[int]] = defaultdict(list)
    for i in live:
        episode = episodes[i]
        action = tokenizer.decode(episode.last_turn_ids, skip_special_tokens=True)
        episode.actions.append(action)
        if episode.in_final_turn:
            results[i] = envs[i].finish(action)
        else:
            batched[type(envs[i])].append(i)
    for env_class, indices in batched.items():
        stepped = env_class.step_batch([envs[i] for i in indices], [episodes[i].actions[-1] for i in indices])
        results.update(zip(indices, stepped))
    return [results[i] for i in live]


def _continue(episode: Episode, env: Environment, result: StepResult, renderer: ObservationRenderer, config: AgentLoopConfig) -> None:
    """Append the observation (and the final-turn instruction once the turn budget is used)."""
    instruction = ""
    if episode.num_turns >= episode.turn_budget:
        instruction = env.final_turn_instruction()
        episode.in_final_turn = True
    last_token = episode.response_ids[-1] if episode.response_ids else None
    # the next turn keeps its full max_turn_tokens: the observation is cut to what is left over
    budget = min(config.max_obs_length, episode.room - config.max_turn_tokens)
    rendered = renderer.render(result.observation, after_token=last_token, budget=budget, suffix=instruction)
    if rendered is None:
        episode.done = episode.out_of_tokens = True
        episode.in_final_turn = False
        return
    episode.append_observation(rendered.token_ids)
    episode.observations.append("\n".join(text for text in (rendered.text, instruction) if text))
    episode.observations_truncated += int(rendered.truncated)
    episode.forced_final = episode.in_final_turn
