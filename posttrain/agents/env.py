"""The text-environment interface that multi-turn agents act in.

An environment is one episode's world. The agent loop calls ``reset(sample)`` once, then
``step(action_text)`` with the text of each agent turn until a result says ``done``:

    observation = env.reset(sample)            # "" when the prompt already says everything
    result = env.step("<search>who ...</search>")
    result.observation, result.reward, result.done, result.info.valid, ...

Parsing actions is the environment's job, never the trainer's. An action the environment cannot
parse is not an error: the step returns ``info.valid = False``, a corrective observation (what was
wrong and what a valid action looks like) and the environment's penalty as reward.

Rewards: the reward of each step lands on the last token of the agent turn that caused it, so an
environment that rewards only its final step gives an episode reward on the final agent token, and
one that rewards intermediate steps gives per-turn rewards.

``step_batch`` steps many episodes of one environment class at once (one call per turn of the
agent loop); an environment that talks to a service overrides it to send one batched request.

``close()`` is called once when the episode is over, whatever ended it (a step's ``done``, the loop's
token budget, or the loop stopping on an error): an environment that holds something per episode (the
tool environment's instances of tool classes) releases it there.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from posttrain.config.schema import EnvConfig


@dataclass(frozen=True)
class EpisodeSample:
    """What an environment sees of a dataset row: the chat prompt, gold answer and extras."""

    prompt: list[dict[str, str]]
    ground_truth: Any
    data_source: str = ""
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # a mixture's source of the row (config/mixture.py); "" without one


@dataclass(frozen=True)
class StepInfo:
    """``valid``: the action parsed; ``effective``: it changed something (a search that ran, an
    answer that was given); ``success``: the episode's goal is reached (e.g. a correct answer).
    ``counts`` holds the environment's own per-step counters (e.g. ``{"searches": 1}``); the agent
    loop sums them per episode and reports their means as ``env/<name>``.
    """

    valid: bool
    effective: bool
    success: bool = False
    counts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeAnswer:
    """An episode's final answer, for the reward path to score by the row's data source (the rollout
    does, with deadlines and counts, after the episodes end: rollout/scoring.py); the step's reward does
    not include it. ``score_cap``: its score is at most this (ToolEnv's ``answer_without_call_score``).
    An environment with a judge of its own (a game, a tool class's ``reward()``) scores itself instead."""

    text: str
    score_cap: float | None = None


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: StepInfo
    answer: EpisodeAnswer | None = None  # an answer for the reward path (its score is added to this step's reward)


class Environment(abc.ABC):
    """One episode of a text environment; subclasses set ``name`` and implement reset/step."""

    name: ClassVar[str] = ""
    # the names of the counters its steps report in ``info.counts``: always in the metrics, 0 when unseen
    counters: ClassVar[tuple[str, ...]] = ()
    # metric name -> (numerator counter, denominator counter): reported as env/<name>, summed over episodes
    ratios: ClassVar[Mapping[str, tuple[str, str]]] = {}
    # this episode's ordinary turns (set by the agent loop before reset; None outside the loop)
    turn_budget: int | None = None
    # True: an episode is a run of the user's own program against the run's endpoint (env.name: program,
    # rollout/program.py); the class holds and checks the options and is never reset or stepped
    runs_program: ClassVar[bool] = False

    @classmethod
    def needed_resources(cls, options: Mapping[str, Any]) -> set[str] | None:
        """The shared resources (``retriever``, ``env_llm``) these options need; None: every one the
        constructor takes. Override when an option decides (a rule-based patient needs no model)."""
        return None

    @classmethod
    def check_sample(cls, sample: EpisodeSample, options: Mapping[str, Any]) -> None:  # noqa: B027 - most environments take any row
        """Raise ValueError (naming the row) for a dataset row this environment, built with the run's
        ``env.options``, cannot play; the trainer checks every row before any worker starts."""

    @classmethod
    def before_training(cls, env: EnvConfig, resources: Mapping[str, Any], samples: Iterable[EpisodeSample]) -> None:  # noqa: B027
        """Once before step 1 of a run that starts (not on a resume), with the run's ``env`` section, the
        shared resources the rollout opened, and the held-out rows (the training rows when there are
        none): raise a :class:`~posttrain.errors.PosttrainError` to refuse the run. Most environments
        have nothing to check; the doctor probes its LLM patient (``agents/doctor/probe.py``)."""

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end an agent turn inside the rollout engine (e.g. ``"</search>"``)."""
        return ()

    @abc.abstractmethod
    def reset(self, sample: EpisodeSample) -> str:
        """Start an episode; returns an observation to show before the first turn ("" for none)."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one agent turn's text."""

    def close(self) -> None:  # noqa: B027 - most environments hold nothing per episode
        """The episode is over (module docstring): release what ``reset`` acquired."""

    def final_turn_instruction(self) -> str:
        """Shown before the extra turn an episode gets when its turn budget is used up."""
        return "You have no turns left. Give your final answer now."

    def finish(self, action: str) -> StepResult:
        """Score the forced final turn; the episode ends whatever the action was."""
        result = self.step(action)
        return StepResult(result.observation, result.reward, True, result.info)

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        """Step ``envs[i]`` with ``actions[i]``; override to batch work across episodes."""
        return [env.step(action) for env, action in zip(envs, actions, strict=True)]
