"""The tool environment (``env.name: tools``): the agent calls the run's tools in its own format.

The tools are ``env.tools`` and ``env.mcp_servers`` (posttrain/tools), told to the model in each
prompt in the run's tool format (``env.tool_format``, models/tool_formats/: the chat template's own, the
built-in format, JSON lines), which also reads each agent turn:

- **Calls** (one or several): each runs through the run's :class:`~posttrain.tools.ToolBox`; the
  results, successes and errors alike, come back as the next observation (``<tool_response>``
  blocks in the built-in format; a tool message for templates that render tools). A call the
  parser could not read, an unknown tool, arguments that do not fit the schema, an exception, a
  timeout, a crashed tool, a call past ``env.max_tool_calls`` per episode: each is an error the
  model reads, with reward ``call_error_penalty`` (<= 0) per failed call. The loop never stops on one.
- **No call**: the turn is the final answer. It ends the episode and is handed to the reward path
  (``StepResult.answer``; rollout/scoring.py), which scores it with the score function of the row's
  ``data_source`` (rewards/registry.py; e.g. ``arithmetic`` reads the last number: the task's own
  answer format) or the run's custom one, with a deadline; the episode's success is its ``acc`` (or
  score >= 1).
- **The final turn** (after ``env.max_turns`` turns): calls are no longer run; the turn counts as
  the answer only if it holds none.

**Tools per row.** A row may bring its own tools (``extra_info.tools``, posttrain/data/format.py): its
prompt is told the run's tools and its own, its calls are read and checked against both (the row's
schema wins where a name is in both), and a call to a tool in neither is ``unknown_tool``. A row's tool
runs only if the run has an implementation of that name; otherwise the call is ``unknown_tool`` with
"no implementation" (such rows suit the next mode). A row with no tools in a run with none is refused.

**Calls as the answer** (``env.options.answer: calls``, e.g. BFCL's single-turn categories) is not an
episode: the run is a single-turn rollout whose responses are read into their calls and scored by the
reward path (rollout/calls.py); this class only checks the option and its rows (:meth:`ToolEnv.check_sample`).
``answer: text`` (the default) is the mode above.

**User turns** (``env.options.answer: turns``, e.g. BFCL's multi-turn categories): the row's prompt is
the first user turn and ``extra_info.later_turns`` (a list of user turns, each a list of chat messages,
or its JSON text) the ones after it. A turn with no call ends the current user turn: the tool classes'
``end_turn()`` runs, and the next user turn's messages come back as the observation (``env/user_turns``
counts them); the turn with no call after the last user turn ends the episode as an answer does in
``text`` mode (its user turn ended first), scored by the classes' ``reward()`` or the row's score
function. The observation is rendered in the run's observation role: a user message in the built-in
format, a tool message where the chat template renders tools.

**Tool classes** (``env.tools: [my_env.py:Warehouse]``, docs/tools.md "Tool classes"): each episode gets
its own instance of each class at ``reset`` (the row's fields go to the class's ``reset``, whose texts are
the first observation), its calls run on it, and ``close`` releases it (the agent loop closes every
episode when it ends). An episode whose instances are lost (a call past its deadline, a crash, a reset
that failed) ends at that step, scored only by its calls' penalties (``tool/lost_instances``). When a
class has ``reward()``, the episode's score at its end (an answer, or the forced final turn whatever it
holds) is the sum of those ``reward()``s instead of the row's score function (``tool/reward_errors``
counts the ones that failed: score 0); ``answer: calls`` always uses the row's score function.

Counters: ``tool/calls``, ``tool/successes``, ``tool/errors``, ``tool/errors/<kind>``, ``tool/late_calls``,
``tool/<name>/calls``, ``tool/<name>/errors/<kind>``, ``answers``, ``tool/lost_instances``,
``tool/reward_errors``; ``tool/success_rate`` is successes over calls. Counter names with a ``/`` are reported as they are (not under ``env/``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from posttrain.agents.env import EpisodeAnswer, Environment, EpisodeSample, StepInfo, StepResult
from posttrain.errors import InputError
from posttrain.models.tool_format import ROW_TOOLS_KEY, row_schemas
from posttrain.rewards.registry import UnknownDataSourceError, score_function_for
from posttrain.tools import CallResult, ParsedTurn, ToolBox
from posttrain.tools.execute import failed


@dataclass(frozen=True)
class AnswerMode:
    """What ``env.options.answer`` says, as what the code reads (never the mode's name): whether the
    row's later user turns come as observations (``turns``), whether the calls are the answer, read from
    a single turn by the rollout (``calls``: rollout/calls.py), and whether a tool class's ``reward()``
    may score the episode instead of the row's data source (not where the calls are the answer)."""

    name: str
    later_user_turns: bool = False
    calls_are_the_answer: bool = False

    @property
    def tool_classes_may_score(self) -> bool:
        return not self.calls_are_the_answer


ANSWER_MODES = {mode.name: mode for mode in (
    AnswerMode("text"), AnswerMode("turns", later_user_turns=True), AnswerMode("calls", calls_are_the_answer=True))}
DEFAULT_ANSWER = "text"


def answer_mode(options: Mapping[str, Any]) -> AnswerMode:
    """``options["answer"]``'s mode (InputError naming the modes for another)."""
    answer = options.get("answer", DEFAULT_ANSWER)
    if answer not in ANSWER_MODES:
        raise InputError(f"ToolEnv options: answer={answer!r} is not one of {', '.join(ANSWER_MODES)} (module docstring)")
    return ANSWER_MODES[answer]


class ToolEnv(Environment):
    """One task solved with the run's tools; see the module docstring for the rules."""

    name: ClassVar[str] = "tools"
    counters: ClassVar[tuple[str, ...]] = (
        "tool/calls", "tool/successes", "tool/errors", "tool/late_calls", "answers", "tool/lost_instances", "tool/reward_errors",
    )
    ratios: ClassVar[Mapping[str, tuple[str, str]]] = {"tool/success_rate": ("tool/successes", "tool/calls")}

    def __init__(
        self, toolbox: ToolBox, *, call_error_penalty: float = 0.0, answer_without_call_score: float | None = None,
        answer: str = DEFAULT_ANSWER,
    ) -> None:
        if call_error_penalty > 0:
            raise InputError(f"ToolEnv options: call_error_penalty={call_error_penalty} is added per failed call, so it must be <= 0")
        self.mode = answer_mode({"answer": answer})
        self.toolbox = toolbox
        self.call_error_penalty = call_error_penalty
        # None: an answer is scored the same with or without a successful call before it; a number caps it
        self.answer_without_call_score = answer_without_call_score
        self.calls_made = 0
        self.successes = 0
        self._sample: EpisodeSample | None = None
        self._row_schemas: list[dict[str, Any]] = []          # the row's own tools, as told in its prompt
        self._row_tools: dict[str, dict[str, Any]] = {}       # ... their functions by name, for the checks
        self._episode: int | None = None                      # the key of this episode's tool class instances
        self._later_turns: list[str] = []                     # answer: turns: the user turns still to come, as text

    @classmethod
    def check_sample(cls, sample: EpisodeSample, options: Mapping[str, Any], *, run_has_tools: bool = True,
                     scores_episodes: bool = False, by_data_source: bool = True) -> None:
        """Raise InputError for a row this environment cannot play with the run's tools, which the
        rollout names (rollout/toolbox.py ``sample_checker`` runs it on every row before any worker
        starts): ``run_has_tools``, env.tools or env.mcp_servers give any; ``scores_episodes``, a tool
        class has ``reward()``; ``by_data_source``, answers are scored by their data source's function
        (no custom one). Its own tools unreadable, no tools at all, no score function for its data
        source where one is needed, later user turns unreadable (``answer: turns``)."""
        _read_sample(sample, answer_mode(options), run_has_tools, scores_episodes, by_data_source)

    @property
    def observation_role(self) -> str:
        return self.toolbox.format.observation_role

    def reset(self, sample: EpisodeSample) -> str:
        if self.mode.calls_are_the_answer:
            raise InputError("env.options.answer=calls is a single-turn rollout (rollout/calls.py, which build_rollout picks), "
                             "not a ToolEnv episode")
        self.close()
        self._sample = sample
        # its data source was checked with the run's reward path before any worker started (check_sample)
        self._row_schemas, self._later_turns = _read_sample(sample, self.mode, bool(self.toolbox.tools), self.toolbox.scores_episodes,
                                                            by_data_source=False)
        self.calls_made = self.successes = 0
        self._row_tools = {schema["function"]["name"]: schema["function"] for schema in self._row_schemas}
        fields = {**sample.extra_info, "prompt": list(sample.prompt), "ground_truth": sample.ground_truth, "data_source": sample.data_source}
        self._episode, opened = self.toolbox.open_episode(fields)
        return opened.text

    def close(self) -> None:
        """Release this episode's tool class instances (their ``close()`` hooks run)."""
        self.toolbox.release(self._episode)
        self._episode = None

    def final_turn_instruction(self) -> str:
        return "You have no tool calls left. Give your final answer now, without calling a tool."

    def step(self, action: str) -> StepResult:
        return type(self).step_batch([self], [action])[0]

    def finish(self, action: str) -> StepResult:
        turn = self.toolbox.read(action, self._row_schemas)
        return self._end(action if turn.is_final else None)

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        """Every episode's calls of this round go to the toolbox together."""
        tool_envs = [_as_tool_env(env) for env in envs]
        turns = [env.toolbox.read(action, env._row_schemas) for env, action in zip(tool_envs, actions, strict=True)]
        planned = [env._plan(turn) for env, turn in zip(tool_envs, turns)]
        runs: dict[int, list[tuple[int, int]]] = {}  # toolbox -> (episode, plan slot) of calls to run
        for i, (env, plan) in enumerate(zip(tool_envs, planned)):
            for j, result in enumerate(plan or []):
                if result is None:
                    runs.setdefault(id(env.toolbox), []).append((i, j))
        for members in runs.values():
            box = tool_envs[members[0][0]].toolbox
            # a plan's malformed calls come first (_plan): slot j is call j - malformed
            results = box.run([turns[i].calls[j - turns[i].malformed] for i, j in members],
                              [tool_envs[i]._row_tools for i, _ in members], [tool_envs[i]._episode for i, _ in members])
            for (i, j), result in zip(members, results, strict=True):
                planned[i][j] = result
        return [env._answered(action) if plan is None else env._calls_result(turn, plan)
                for env, action, turn, plan in zip(tool_envs, actions, turns, planned)]

    def _plan(self, turn: ParsedTurn) -> list[CallResult | None] | None:
        """None for a final answer; else one slot per call: an error decided here, or None (to run)."""
        if turn.is_final:
            return None
        plan: list[CallResult | None] = [failed("?", "bad_json", self.toolbox.format.malformed_hint)] * turn.malformed
        for call in turn.calls:
            if self.calls_made >= self.toolbox.max_calls:
                plan.append(failed(call.name, "over_budget", f"this task allows {self.toolbox.max_calls} tool calls; answer now"))
            else:
                plan.append(None)
            self.calls_made += 1
        return plan

    def _calls_result(self, turn: ParsedTurn, results: list[CallResult | None]) -> StepResult:
        done = [result for result in results if result is not None]
        counts: dict[str, float] = defaultdict(float)
        counts["tool/calls"] = len(done)
        for result in done:
            named = result.name in self.toolbox.tools  # a malformed call or an unknown tool has no counters of its own
            if named:
                counts[f"tool/{result.name}/calls"] += 1
            if result.ok:
                counts["tool/successes"] += 1
                continue
            counts["tool/errors"] += 1
            counts[f"tool/errors/{result.error}"] += 1
            if named:
                counts[f"tool/{result.name}/errors/{result.error}"] += 1
        errors = int(counts["tool/errors"])
        self.successes += len(done) - errors
        lost = not self.toolbox.alive(self._episode)  # a call timed out or crashed: the episode's state is gone
        if lost:
            counts["tool/lost_instances"] = 1
        observation = self.toolbox.observation([(result.name, result.text) for result in done])
        return StepResult(
            observation, self.call_error_penalty * errors, lost,
            StepInfo(valid=turn.malformed == 0, effective=errors < len(done), counts=dict(counts)),
        )

    def _answered(self, answer: str) -> StepResult:
        """A turn with no call: the episode's end, or (``answer: turns``) the next user turn."""
        if not self._later_turns:
            return self._end(answer)
        self.toolbox.end_turn(self._episode)
        if not self.toolbox.alive(self._episode):  # end_turn failed: the episode's state is gone
            return StepResult("", 0.0, True, StepInfo(valid=True, effective=False, counts={"tool/lost_instances": 1}))
        return StepResult(self._later_turns.pop(0), 0.0, False, StepInfo(valid=True, effective=True, counts={"user_turns": 1}))

    def _end(self, answer: str | None) -> StepResult:
        """The episode's end: ``answer`` is its final turn's text, None for a forced final turn that held
        calls (not run; one failed call's penalty). Scored by the tool classes' reward() if they have one,
        else handed to the reward path (an answer only: rollout/scoring.py), capped by
        ``answer_without_call_score`` when no call succeeded."""
        if self._sample is None:
            raise RuntimeError("ToolEnv.step before reset: call reset(sample) first")
        counts = {"answers": 1} if answer is not None else {"tool/late_calls": 1}
        penalty = 0.0 if answer is not None else self.call_error_penalty
        if self.mode.later_user_turns:  # the last user turn ends with the episode
            self.toolbox.end_turn(self._episode)
        if not self.toolbox.alive(self._episode):
            counts["tool/lost_instances"] = 1
            return StepResult("", penalty, True, StepInfo(valid=answer is not None, effective=False, counts=counts))
        if not self.toolbox.scores_episodes:  # the row's score function judges the answer: the reward path scores it
            if answer is None:
                return StepResult("", penalty, True, StepInfo(valid=False, effective=False, counts=counts))
            return StepResult("", 0.0, True, StepInfo(valid=True, effective=True, counts=counts),
                              answer=EpisodeAnswer(answer, self.answer_without_call_score if self.successes == 0 else None))
        score, success = self._rewarded(answer, counts)
        if self.answer_without_call_score is not None and self.successes == 0:
            score = min(score, self.answer_without_call_score)
        answered = answer is not None
        return StepResult("", score + penalty, True, StepInfo(valid=answered, effective=answered, success=success, counts=counts))

    def _rewarded(self, answer: str | None, counts: dict[str, float]) -> tuple[float, bool]:
        """The sum of the episode's instances' reward()s, and whether each says success; (0, False) counted
        in ``tool/reward_errors`` when one raised, hung, crashed or returned no number."""
        values = self.toolbox.episode_reward(self._episode, answer)
        try:
            if isinstance(values, CallResult):
                raise ValueError(values.text)
            scored = [_scored(value) for value in values]
        except (TypeError, ValueError, KeyError):
            counts["tool/reward_errors"] = 1
            return 0.0, False
        return sum(score for score, _ in scored), all(success for _, success in scored)


LATER_TURNS_KEY = "later_turns"  # answer: turns: extra_info's user turns after the prompt


def _read_sample(sample: EpisodeSample, mode: AnswerMode, run_has_tools: bool, scores_episodes: bool,
                 by_data_source: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """The row's own tool schemas and its later user turns, or InputError (:meth:`ToolEnv.check_sample`)."""
    schemas = row_schemas(sample.extra_info.get(ROW_TOOLS_KEY))
    # a row that says it has no tools (an empty list, as some of BFCL's irrelevance rows) is played without
    # any; a row that says nothing, in a run that has none, is a mistake in the data or the config
    if not schemas and not run_has_tools and sample.extra_info.get(ROW_TOOLS_KEY) in (None, ""):
        raise InputError(
            "env.name=tools needs tools: list them in env.tools (e.g. posttrain.tools:calculator) or env.mcp_servers, "
            f"or give each row its own (extra_info.tools); a row of {sample.data_source!r} has none"
        )
    if by_data_source and not (scores_episodes and mode.tool_classes_may_score):
        try:  # the final answer is scored by the row's data source
            score_function_for(sample.data_source)
        except UnknownDataSourceError as error:
            raise InputError(f"{error}; or give a tool class of env.tools a reward() (docs/tools.md)") from None
    return schemas, _user_turns(sample.extra_info.get(LATER_TURNS_KEY)) if mode.later_user_turns else []


def _scored(scored: Any) -> tuple[float, bool]:
    """A score function's (or reward()'s) value: a number, or a dict with ``score`` and optionally ``acc``;
    success is ``acc``, else score >= 1."""
    score = float(scored["score"] if isinstance(scored, dict) else scored)
    return score, bool(scored.get("acc", score >= 1.0)) if isinstance(scored, dict) else score >= 1.0


def _user_turns(value: Any) -> list[str]:
    """``extra_info.later_turns`` (a list of user turns, each a list of messages, or its JSON text) as one text per turn."""
    turns = json.loads(value) if isinstance(value, str) and value.strip() else value or []
    if not isinstance(turns, list) or not all(isinstance(turn, list) and all(isinstance(m, dict) and "content" in m for m in turn)
                                             for turn in turns):
        raise InputError(f"extra_info.{LATER_TURNS_KEY} must be a list of user turns, each a list of chat messages "
                         '([[{"role": "user", "content": ...}], ...]); env.options.answer=turns reads it')
    return ["\n\n".join(str(message["content"]) for message in turn) for turn in turns]


def _as_tool_env(env: Environment) -> ToolEnv:
    if not isinstance(env, ToolEnv):
        raise TypeError(f"ToolEnv.step_batch got a {type(env).__name__}; step each environment class with its own step_batch")
    return env


