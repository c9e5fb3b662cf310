"""Reward managers: responses in a Batch → a score on each response's last token.

The one reward path: every answer that a rule, a batched scorer or a custom function judges is
scored here, with deadlines and the counts the circuit breakers read. Two ways in:

- ``manager(batch)``: single-turn responses in a Batch (below);
- ``manager.score(answers)``: :class:`Answer` s that a rollout read out of its responses or episodes
  (a tool-calling agent's final text; a one-turn task's parsed calls, passed as ``calls=`` to a
  function that takes it). ``None`` in their place is an answer that could not be read: it scores 0
  without a call (the rollout that read it counts why).

Both managers read from the Batch (see :mod:`posttrain.keys`)
  RESPONSE_IDS (B, T), and RESPONSE_MASK (B, T) or else the last T columns of ATTENTION_MASK (B, L);
  DATA_SOURCE, GROUND_TRUTH and (optionally) EXTRA_INFO, one per sample;
decode each response up to its last valid token (the mask's last 1) with special tokens skipped,
score it, and return a :class:`RewardResult` whose ``token_scores`` (B, T) hold each sample's score
at that last valid position and zeros elsewhere (an empty response's score sits at position 0).

:class:`RewardManager` calls a score function once per sample, chosen by ``data_source`` from a
table (:data:`~posttrain.rewards.registry.DEFAULT_SCORE_FUNCTIONS`) unless one ``score_function``
scores everything (the user's custom function). :class:`BatchRewardManager` calls one function once
with lists (``solution_strs``, ``ground_truths``, ...), for scorers that batch (a model, an API).

Failures are contained, and nothing a score function does escapes the manager. A sample scores 0
and is counted in ``metrics`` when its call
  raises (or its process dies)                   ``reward/errors``
  returns an unusable score                      ``reward/errors``: anything but an int or a float
                                                 (numpy's too) that is finite as a float, alone or as a
                                                 dict's ``"score"``; so ``True``, ``"1.0"``, ``None``,
                                                 ``1j``, ``nan``, ``inf`` and ``10**400`` (too big for a
                                                 float) are all the same case
  runs past its deadline, or past the budget     ``reward/timeouts``
``reward/samples`` is the number of samples scored, so the failed fraction is
(errors + timeouts) / samples; the first failure of each call is logged with its reason and kept in
:attr:`RewardResult.first_failure` (the trainer's circuit breaker quotes it).

``timeout_s`` is the deadline per sample (see :mod:`posttrain.deadlines`); the batched call
gets ``timeout_s`` times the batch size. ``timeout_s=None`` scores in this process with no deadline.
A score function that asks a service (an LLM judge on a Ray worker or at a URL), marked
``in_process = True``, is called in this process instead of the child, its calls side by side in
threads, each with the same deadline and counted the same way.
``budget_s`` bounds the whole batch's scoring (one manager call: a training step, or an
asynchronous generator's unit): the samples not scored when it is spent score 0 as timeouts.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from posttrain import keys
from posttrain.metrics import Metrics, mean, total
from posttrain.protocol import Batch
from posttrain.rewards.custom import FileScoreFunction
from posttrain.rewards.judge import judge_answers
from posttrain.rewards.rubric import PREFIX as RUBRIC_PREFIX
from posttrain.rewards.rubric import Rubric, build_rubric
from posttrain.rewards.registry import (
    BATCHED_CONTEXT_KEYWORDS,
    BATCHED_REQUIRED_KEYWORDS,
    DEFAULT_SCORE_FUNCTIONS,
    ScoreFunction,
    check_callable_with,
    context_keywords,
    score_function_for,
)
from posttrain.deadlines import (
    CallOutcome, InlineScorer, ProcessScorer, ServiceScorer, check_picklable, describe_exception, runs_in_process,
)

logger = logging.getLogger(__name__)


@dataclass
class RewardResult:
    token_scores: torch.Tensor                                     # (B, T) float32, score on the last valid response token
    scores: torch.Tensor                                           # (B,) float32
    extra: dict[str, np.ndarray] = field(default_factory=dict)     # name -> (B,) values besides "score" (e.g. acc); NaN/None where missing
    metrics: Metrics = field(default_factory=dict)                 # reward/{samples,errors,timeouts,empty_responses}: counts
    first_failure: str | None = None                               # "sample 3: ZeroDivisionError: ... (f.py:2 in f)", if any failed

    def to_batch(self) -> Batch:
        """TOKEN_SCORES as a Batch to union into the step's batch; extras as ``reward_extra/<name>``, metrics in meta."""
        extra = {f"reward_extra/{name}": values for name, values in self.extra.items()}
        return Batch.from_dict({keys.TOKEN_SCORES: self.token_scores}, extra).with_metrics(self.metrics)


@dataclass(frozen=True)
class Answer:
    """What a response or an episode answered, for the reward path: its text, the row's ground truth,
    data source and extra_info, and, where the calls are the answer, the calls as
    ``[{"name": ..., "arguments": {...}}]`` in the order written."""

    text: str
    ground_truth: Any
    data_source: str
    extra_info: Mapping[str, Any] | None = None
    calls: list[dict[str, Any]] | None = None
    prompt: Sequence[Mapping[str, Any]] | None = None  # the row's chat messages (a judge's {question})


@dataclass
class AnswerScores:
    scores: torch.Tensor                                           # (B,) float32
    extra: dict[str, np.ndarray]                                   # as RewardResult's
    metrics: Metrics                                               # reward/{samples,errors,timeouts}: counts
    first_failure: str | None = None
    scored: np.ndarray | None = None                               # (B,) bool: the call scored it (no error, in time)


@dataclass(frozen=True)
class DecodedResponses:
    texts: list[str]
    last_positions: torch.Tensor  # (B,) int64, index of the last valid response token, -1 if none
    width: int                    # T


def decode_responses(batch: Batch, tokenizer: Any) -> DecodedResponses:
    """Each response's text up to its last valid token (special tokens skipped)."""
    if keys.RESPONSE_IDS not in batch:
        raise KeyError(f"the reward manager needs {keys.RESPONSE_IDS!r} (B, T) in the Batch; it has {sorted(batch.keys())}")
    response_ids = batch[keys.RESPONSE_IDS].cpu()
    width = response_ids.shape[1]
    mask = _response_mask(batch, width).cpu()
    if mask.shape != response_ids.shape:
        raise ValueError(f"response mask of shape {tuple(mask.shape)} does not match {keys.RESPONSE_IDS!r} of shape {tuple(response_ids.shape)}")
    positions = torch.arange(width).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
    texts = tokenizer.batch_decode(
        [response_ids[row, : int(end) + 1].tolist() for row, end in enumerate(last)], skip_special_tokens=True
    )
    return DecodedResponses(texts, last, width)


def _response_mask(batch: Batch, width: int) -> torch.Tensor:
    if keys.RESPONSE_MASK in batch:
        return batch[keys.RESPONSE_MASK]
    if keys.ATTENTION_MASK in batch:
        return batch[keys.ATTENTION_MASK][:, -width:]
    raise KeyError(
        f"the reward manager needs {keys.RESPONSE_MASK!r} (B, T) or {keys.ATTENTION_MASK!r} (B, P+T) to find "
        f"where each response ends; the Batch has {sorted(batch.keys())}"
    )


def place_scores(scores: torch.Tensor, last_positions: torch.Tensor, width: int) -> torch.Tensor:
    """(B,) scores → (B, T) zeros with each score at its last valid position (position 0 if none)."""
    token_scores = torch.zeros((scores.shape[0], width), dtype=torch.float32)
    token_scores[torch.arange(scores.shape[0]), last_positions.clamp(min=0)] = scores.to(torch.float32)
    return token_scores


def _per_sample(batch: Batch, key: str, required: bool = True) -> list[Any]:
    if key in batch.non_tensors:
        return list(batch.non_tensors[key])
    if not required:
        return [None] * len(batch)
    raise KeyError(f"the reward manager needs the non-tensor column {key!r}; the Batch has {sorted(batch.keys())}")


def _names(function: ScoreFunction, parameter: str) -> bool:
    """``function`` has a parameter of that name (not only ``**kwargs``)."""
    return parameter in inspect.signature(function).parameters


def _make_scorer(timeout_s: float | None) -> InlineScorer | ProcessScorer:
    return InlineScorer() if timeout_s is None else ProcessScorer(timeout_s)


def _run(scorer: InlineScorer | ProcessScorer, services: ServiceScorer, functions: Sequence[ScoreFunction],
         calls: Sequence[tuple[int, dict[str, Any]]], **limits: Any) -> list[CallOutcome]:
    """Each call's outcome, in order: a service's calls (:func:`runs_in_process`) in this process's
    threads, every other in ``scorer`` (its child process)."""
    here = [i for i, (index, _) in enumerate(calls) if runs_in_process(functions[index])]
    if not here:
        return scorer.run(functions, calls, **limits) if calls else []
    kept = set(here)
    away = [i for i in range(len(calls)) if i not in kept]
    local = [f if runs_in_process(f) else None for f in functions]
    remote = [None if runs_in_process(f) else f for f in functions]
    outcomes: list[CallOutcome | None] = [None] * len(calls)
    start = time.monotonic()
    for i, outcome in zip(here, services.run(local, [calls[i] for i in here], **limits)):
        outcomes[i] = outcome
    if away:  # the budget bounds both together: the child's calls get what the service's left
        if limits.get("budget_s") is not None:
            limits = limits | {"budget_s": max(limits["budget_s"] - (time.monotonic() - start), 1e-9)}
        for i, outcome in zip(away, scorer.run(remote, [calls[i] for i in away], **limits)):
            outcomes[i] = outcome
    return outcomes


class RewardManager:
    """Scores each sample with the function for its data source (or with ``score_function``)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        score_functions: Mapping[str, ScoreFunction] = DEFAULT_SCORE_FUNCTIONS,
        score_function: ScoreFunction | None = None,
        timeout_s: float | None = 10.0,
        budget_s: float | None = None,
    ) -> None:
        self.tokenizer, self.budget_s = tokenizer, budget_s
        self.score_functions = dict(score_functions)
        self.score_function = score_function
        candidates = {"custom": score_function} if score_function is not None else self.score_functions
        for name, function in candidates.items():
            check_callable_with(function, repr(name))
            if timeout_s is not None and not runs_in_process(function):
                check_picklable(function, repr(name))
        self.scorer = _make_scorer(timeout_s)
        self.services = ServiceScorer(timeout_s)
        self.rubric = score_function if isinstance(score_function, Rubric) else None
        self.judge: Any = None  # an EnvLLMClient (agents/env_llm.py): the judge parts' model, connected when the run opens (rollout/scoring.py open_judge)
        self.judge_llm: Any = None  # where that model is: an EnvLLMConfig (set by rollout/scoring.py reward_manager_for)
        self.judge_timeout_s: float | None = None  # one batched judge request's deadline

    @property
    def judged(self) -> bool:
        """Whether a rubric part is a judge, so the manager asks an LLM (rewards/judge.py)."""
        return self.rubric is not None and bool(self.rubric.judged)

    def __call__(self, batch: Batch) -> RewardResult:
        decoded = decode_responses(batch, self.tokenizer)
        return place_answer_scores(self.score(answers_of(batch, decoded.texts)), decoded)

    def score(self, answers: Sequence[Answer | None]) -> AnswerScores:
        """Each answer's score by its data source's function (or the custom one), in a child process
        with a deadline each; None (unreadable) scores 0 without a call."""
        read = [answer for answer in answers if answer is not None]
        if self.score_function is not None:
            functions = [self.score_function] * len(read)
        else:  # every data source is looked up before any scoring, so an unknown one fails fast
            functions = [score_function_for(answer.data_source, self.score_functions) for answer in read]
        table = {function: index for index, function in enumerate(dict.fromkeys(functions))}
        accepted = {function: context_keywords(function) for function in table}
        calls = []
        for answer, function in zip(read, functions):
            context = {"data_source": answer.data_source, "extra_info": answer.extra_info, "calls": answer.calls}
            # calls=None (the calls are not the answer) goes only to a function that names the parameter
            given = [k for k in accepted[function] if k != "calls" or answer.calls is not None or _names(function, "calls")]
            arguments = {"solution_str": answer.text, "ground_truth": answer.ground_truth} | {k: context[k] for k in given}
            calls.append((table[function], arguments))
        outcomes = iter(_run(self.scorer, self.services, list(table), calls, budget_s=self.budget_s))
        scored = _collect([None if answer is None else next(outcomes) for answer in answers])
        return self._judge_parts(answers, scored) if self.judged else scored

    def _judge_parts(self, answers: Sequence[Answer | None], scored: AnswerScores) -> AnswerScores:
        """The rubric's judge parts filled in (rewards/judge.py): every answer the scoring call scored and no
        judge rule accepted, each judge part's question for it, all in one batched request; then each
        answer's score and acc over all its parts."""
        if self.judge is None:
            raise RuntimeError("the rubric has judge parts but no judge is connected: open the rollout first (rollout/scoring.py open_judge)")
        assert self.rubric is not None and scored.scored is not None
        extra = dict(scored.extra)
        judged = judge_answers(self.rubric.judged, self.judge, self.judge_timeout_s, answers, scored.scored, extra)
        if judged.late:
            logger.warning("reward: the judge did not answer within reward.judge.timeout_s=%gs; its questions score 0", self.judge_timeout_s)
        values, failed, unread = judged.values, judged.failed, judged.unread
        scores, acc = self.rubric.combine_rows(extra, values, scored.scored, scored.scores.clone())
        for name in values:
            extra[f"{RUBRIC_PREFIX}{name}"] = values[name]
            extra[f"{RUBRIC_PREFIX}{name}/errors"] = np.where(np.isnan(values[name]), np.nan, failed[name])
            extra[f"{RUBRIC_PREFIX}{name}/unparsable"] = np.where(np.isnan(values[name]), np.nan, unread[name])
        if not np.isnan(acc).all():
            extra["acc"] = acc
        # replies and failures as this call saw them: a request past its deadline is failed here, whatever its thread counts later
        seen = {"judge/replies": total(judged.asked), "judge/failures": total(judged.failures)}
        metrics = scored.metrics | _rubric_metrics(extra) | self.judge.drain_metrics() | seen
        return AnswerScores(scores, extra, metrics, scored.first_failure, scored.scored)

    def close(self) -> None:
        """Stop the scoring process (it is also stopped when the manager is garbage-collected) and let the judge go."""
        self.scorer.close()
        if self.judge is not None:
            self.judge.close()
            self.judge = None


class BatchRewardManager:
    """Scores the whole batch with one call of ``score_function(solution_strs=..., ground_truths=..., ...)``.

    The function returns one float or dict per sample, in order. If the call fails, every sample
    scores 0 and counts as an error (or a timeout).
    """

    def __init__(self, tokenizer: Any, score_function: ScoreFunction, *, timeout_s: float | None = 10.0, budget_s: float | None = None) -> None:
        check_callable_with(score_function, "custom (batched)", BATCHED_REQUIRED_KEYWORDS, BATCHED_CONTEXT_KEYWORDS)
        if timeout_s is not None and not runs_in_process(score_function):
            check_picklable(score_function, "custom (batched)")
        self.tokenizer, self.score_function, self.timeout_s, self.budget_s = tokenizer, score_function, timeout_s, budget_s
        self.scorer = _make_scorer(timeout_s)
        self.services = ServiceScorer(timeout_s)

    def __call__(self, batch: Batch) -> RewardResult:
        decoded = decode_responses(batch, self.tokenizer)
        return place_answer_scores(self.score(answers_of(batch, decoded.texts)), decoded)

    def score(self, answers: Sequence[Answer | None]) -> AnswerScores:
        """The read answers in one call (None, unreadable, scores 0 without it)."""
        read = [answer for answer in answers if answer is not None]
        context = {"data_sources": [a.data_source for a in read], "extra_infos": [a.extra_info for a in read],
                   "calls": [a.calls for a in read]}
        arguments = {"solution_strs": [a.text for a in read], "ground_truths": [a.ground_truth for a in read]}
        arguments |= {k: context[k] for k in context_keywords(self.score_function, BATCHED_CONTEXT_KEYWORDS)}
        deadline = None if self.timeout_s is None else self.timeout_s * max(len(read), 1)
        outcomes = []
        if read:
            (outcome,) = _run(self.scorer, self.services, [self.score_function], [(0, arguments)], timeout_s=deadline,
                              budget_s=self.budget_s)
            outcomes = _split_batched(outcome, len(read))
        outcomes = iter(outcomes)
        return _collect([None if answer is None else next(outcomes) for answer in answers])

    def close(self) -> None:
        self.scorer.close()


def build_reward_manager(
    tokenizer: Any,
    *,
    custom_path: str | None = None,
    custom_name: str = "compute_score",
    reward_kwargs: Mapping[str, Any] | None = None,
    timeout_s: float | None = 10.0,
    budget_s: float | None = None,
    batched: bool = False,
    rubric: Sequence[Mapping[str, Any]] = (),
) -> RewardManager | BatchRewardManager:
    """The manager a run uses, from ``custom_reward_function``'s fields given one by one.

    Without ``custom_path``: a :class:`RewardManager` over the built-in data sources. With it: the
    function ``custom_name`` from that file, ``reward_kwargs`` bound, scores every sample — in a
    :class:`BatchRewardManager` when ``batched``. With ``rubric`` (``reward.rubric``'s parts): the
    :class:`~posttrain.rewards.rubric.Rubric` scores every sample.
    """
    if rubric:
        if custom_path is not None or batched:
            raise ValueError("reward.rubric scores every sample; leave custom_reward_function.path and the batch reward manager unset, "
                             "or make your function a part of the rubric (rule: FILE.py:FUNCTION)")
        return RewardManager(tokenizer, score_function=build_rubric(rubric), timeout_s=timeout_s, budget_s=budget_s)
    if custom_path is None:
        if batched or reward_kwargs:
            raise ValueError(
                "batched scoring and reward_kwargs apply to a custom function; set custom_reward_function.path"
            )
        return RewardManager(tokenizer, timeout_s=timeout_s, budget_s=budget_s)
    function = FileScoreFunction(custom_path, custom_name, reward_kwargs, batched=batched)
    if batched:
        return BatchRewardManager(tokenizer, function, timeout_s=timeout_s, budget_s=budget_s)
    return RewardManager(tokenizer, score_function=function, timeout_s=timeout_s, budget_s=budget_s)


def answers_of(batch: Batch, texts: Sequence[str]) -> list[Answer]:
    """The batch's responses (``texts``, decoded) as answers, with each row's ground truth, data source, extra_info
    and prompt messages."""
    return [Answer(text, truth, source, info, prompt=prompt) for text, truth, source, info, prompt in zip(
        texts, _per_sample(batch, keys.GROUND_TRUTH), _per_sample(batch, keys.DATA_SOURCE),
        _per_sample(batch, keys.EXTRA_INFO, required=False), _per_sample(batch, keys.RAW_PROMPT, required=False), strict=True)]


def place_answer_scores(scored: AnswerScores, decoded: DecodedResponses) -> RewardResult:
    """Scores on each response's last valid token, with the count of empty responses."""
    metrics = scored.metrics | {"reward/empty_responses": total((decoded.last_positions < 0).sum().item())}
    return RewardResult(place_scores(scored.scores, decoded.last_positions, decoded.width), scored.scores, scored.extra,
                        metrics, scored.first_failure)


def _split_batched(outcome: CallOutcome, size: int) -> list[CallOutcome]:
    if not outcome.ok:
        return [outcome] * size
    values = outcome.value
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or len(values) != size:
        length = len(values) if isinstance(values, Sequence) else "no list"
        error = f"the batched score function returned {type(values).__name__} ({length}); return a list of {size} floats or dicts"
        return [CallOutcome(error=error)] * size
    return [CallOutcome(value=v) for v in values]


def _as_score_dict(value: Any) -> dict[str, Any]:
    """A score function's return value as a dict with a finite float "score"; ValueError otherwise."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"returned a dict without a 'score' (keys {_shown(list(value))}); add one")
        return dict(value) | {"score": _as_score(value["score"], "a dict whose 'score' is")}
    return {"score": _as_score(value, "returned")}


def _as_score(value: Any, what: str) -> float:
    """``value`` as a finite float if it is a number (not a bool), ValueError naming it otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} {type(value).__name__} {_shown(value)}; return a float or a dict with a float 'score'")
    try:
        score = float(value)
    except OverflowError:
        raise ValueError(f"{what} {type(value).__name__} {_shown(value)}, too large for a float") from None
    if not math.isfinite(score):
        raise ValueError(f"{what} the non-finite {score}; return a finite float")
    return score


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, and never an exception (a user's __repr__ may raise)."""
    try:
        text = repr(value)
    except Exception as error:  # noqa: BLE001 - e.g. an int too long to print, or a broken __repr__
        return f"<unprintable: {type(error).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _collect(outcomes: Sequence[CallOutcome | None]) -> AnswerScores:
    """Scores from each answer's outcome (None: an unreadable answer, 0 without a call)."""
    results: list[dict[str, Any] | None] = []
    errors, timeouts, first_failure = 0, 0, None
    for index, outcome in enumerate(outcomes):
        if outcome is None:
            results.append(None)
            continue
        failure = outcome.error or ("timed out" if outcome.timed_out else None)
        if failure is None:
            try:
                results.append(_as_score_dict(outcome.value))
                continue
            except Exception as error:  # noqa: BLE001 - the value's own methods (__eq__, __hash__ of its keys) are user code
                failure = f"the score function {error}" if isinstance(error, ValueError) else f"its result failed: {describe_exception(error)}"
        results.append(None)
        timeouts += outcome.timed_out
        errors += not outcome.timed_out
        first_failure = first_failure or f"sample {index}: {failure}"
    if first_failure is not None:
        logger.warning("reward: %d of %d samples scored 0 (%d errors, %d timeouts); first, %s",
                       errors + timeouts, len(outcomes), errors, timeouts, first_failure)
    scores = torch.tensor([r["score"] if r else 0.0 for r in results], dtype=torch.float32)
    metrics = {
        "reward/samples": total(sum(outcome is not None for outcome in outcomes)),  # scored: an unreadable answer is not
        "reward/errors": total(errors),
        "reward/timeouts": total(timeouts),
    }
    extra = _extra_columns(results)
    return AnswerScores(scores, extra, metrics | _rubric_metrics(extra), first_failure,
                        np.array([r is not None for r in results], dtype=bool))


def _rubric_metrics(extra: Mapping[str, np.ndarray]) -> Metrics:
    """A rubric's parts (rewards/rubric.py): ``reward/<name>``, the mean over the answers it scored, and
    ``reward/<name>/errors``, a count."""
    metrics: Metrics = {}
    for column, values in extra.items():
        if not column.startswith(RUBRIC_PREFIX) or values.dtype != np.float64:
            continue
        scored = values[~np.isnan(values)]
        name = "reward/" + column[len(RUBRIC_PREFIX):]
        if column.endswith(("/errors", "/unparsable")):
            metrics[name] = total(float(scored.sum()))
        elif len(scored):
            metrics[name] = mean(float(scored.mean()), len(scored))
    return metrics


def _extra_columns(results: Sequence[dict[str, Any] | None]) -> dict[str, np.ndarray]:
    """Per-key (B,) arrays of the non-score values: float64 with NaN gaps if all are real numbers
    that fit a float, else object with None."""
    names = list(dict.fromkeys(k for r in results if r for k in r if k != "score"))
    columns = {}
    for name in names:
        values = [r.get(name) if r else None for r in results]
        columns[name] = _float_column(values)
        if columns[name] is None:
            column = np.empty(len(values), dtype=object)
            for row, value in enumerate(values):  # one by one, so a list value stays one object
                column[row] = value
            columns[name] = column
    return columns


def _float_column(values: Sequence[Any]) -> np.ndarray | None:
    if not all(v is None or isinstance(v, (int, float, bool, np.integer, np.floating, np.bool_)) for v in values):
        return None
    try:
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    except OverflowError:  # an int beyond a float's range stays as it is
        return None
