"""Circuit breakers: a step that failed as a whole stops the run, instead of training on zeros.

Both trainers check each training step's metrics, so the same breakers work in synchronous and
asynchronous runs (there the batch's units are merged first, each metric by its kind: counts add up,
:mod:`posttrain.metrics`). The fraction breakers read counts (SUM metrics) as they were made, never a
mean multiplied back by its count. A breaker raises :class:`CircuitBreakerError`, whose
message names the breaker, the numbers, the first failure when this process saw it, and the key to
change; it is a PosttrainError, which the CLI shows as one line.

    breaker        the step's failed calls of all its calls               trips when the fraction reaches
    reward         reward/errors + reward/timeouts of reward/samples     custom_reward_function.stop_at_failed_fraction
    retriever      env/retriever_errors of env/searches + that            env.retriever.stop_at_failed_fraction
    env LLM        env_llm/failures of env_llm/replies                     env.llm.stop_at_failed_fraction
    judge          judge/failures of judge/replies (a rubric's judge)      reward.judge.stop_at_failed_fraction
    non-finite     steps in a row in which every update of the actor (or   trainer.stop_after_skipped_steps
                   of the critic) was skipped for a non-finite gradient
                   (``actor/skipped`` = 1: the weights did not move)

A fraction breaker looks only at a step that made at least one such call; 1.0 (the defaults) trips
only when every call failed, a smaller fraction sooner, ``None`` never. ``stop_after_skipped_steps=0``
never stops. The reward's time budget per step (``custom_reward_function.step_timeout_s``) is kept by
the reward manager: samples past it count as timeouts here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from posttrain.config.schema import PosttrainConfig
from posttrain.errors import PosttrainError
from posttrain.metrics import Kind, Metric

RESUME = "Then run the same command: it resumes from the last checkpoint (trainer.resume_mode=auto)"


class CircuitBreakerError(PosttrainError):
    """A whole step failed (rewards, a service, or the updates): the run stops; the message says why and what to change."""


@dataclass(frozen=True)
class BreakerLimits:
    reward: float | None = 1.0       # the failed fraction of a step's rewards that stops the run; None: never
    retriever: float | None = 1.0    # ... of its retriever searches
    env_llm: float | None = 1.0      # ... of its env-LLM replies
    judge: float | None = 1.0        # ... of its judge replies
    skipped_steps: int = 3           # steps in a row with every update skipped that stop the run; 0: never

    @classmethod
    def from_config(cls, config: PosttrainConfig) -> BreakerLimits:
        return cls(
            config.custom_reward_function.stop_at_failed_fraction, config.env.retriever.stop_at_failed_fraction,
            config.env.llm.stop_at_failed_fraction, config.reward.judge.stop_at_failed_fraction, config.trainer.stop_after_skipped_steps,
        )


@dataclass(frozen=True)
class _FractionBreaker:
    name: str
    limit_field: str                                            # of BreakerLimits
    key: str                                                    # the config key of the limit
    counts: Callable[[Mapping[str, Metric]], tuple[float, float] | None]  # (failed, all), or None when not measured
    failed: str                                                 # what failed, for the message
    fix: str


def _count(metrics: Mapping[str, Metric], name: str) -> float:
    """A count the step made (0 when it made none); refuses a metric that is not one."""
    metric = metrics.get(name)
    if metric is None:
        return 0.0
    if metric.kind is not Kind.SUM:
        raise TypeError(f"circuit breakers count with {name!r}, which is made as a {metric.kind.value}, not a count")
    return metric.value


def _reward_counts(metrics: Mapping[str, Metric]) -> tuple[float, float] | None:
    if "reward/samples" not in metrics:
        return None
    return _count(metrics, "reward/errors") + _count(metrics, "reward/timeouts"), _count(metrics, "reward/samples")


def _retriever_counts(metrics: Mapping[str, Metric]) -> tuple[float, float] | None:
    if "env/retriever_errors" not in metrics:
        return None
    errors = _count(metrics, "env/retriever_errors")
    return errors, errors + _count(metrics, "env/searches")


def _replies_counts(prefix: str) -> Callable[[Mapping[str, Metric]], tuple[float, float] | None]:
    """(failed, all) replies of a model client reporting as ``<prefix>/*`` (agents/env_llm.py)."""
    def counts(metrics: Mapping[str, Metric]) -> tuple[float, float] | None:
        if f"{prefix}/replies" not in metrics:
            return None
        return _count(metrics, f"{prefix}/failures"), _count(metrics, f"{prefix}/replies")
    return counts


_FRACTION_BREAKERS = (
    _FractionBreaker(
        "reward", "reward", "custom_reward_function.stop_at_failed_fraction", _reward_counts,
        "rewards errored or timed out",
        "fix the score function (the run's log has each failure), give it more time (custom_reward_function.timeout_s, "
        "custom_reward_function.step_timeout_s)",
    ),
    _FractionBreaker(
        "retriever", "retriever", "env.retriever.stop_at_failed_fraction", _retriever_counts,
        "retriever searches failed",
        "check that the retriever is up (env.retriever.url, or the service the run started; its warnings are in the log)",
    ),
    _FractionBreaker(
        "env LLM", "env_llm", "env.llm.stop_at_failed_fraction", _replies_counts("env_llm"),
        "env-LLM replies failed (finish_reason=error)",
        "check the environment's model (env.llm.url and env.llm.api_model, or the Env-LLM worker's log)",
    ),
    _FractionBreaker(
        "judge", "judge", "reward.judge.stop_at_failed_fraction", _replies_counts("judge"),
        "judge replies failed or came too late",
        "check the judge's model (env.llm.url and env.llm.api_model, or the Env-LLM worker's log), give it more time "
        "(reward.judge.timeout_s)",
    ),
)


class CircuitBreakers:
    """The breakers of one run; the non-finite one counts across steps."""

    def __init__(self, limits: BreakerLimits) -> None:
        self.limits = limits
        self.skipped_in_a_row = 0

    def check_rollout(self, metrics: Mapping[str, Metric], step: int, *, notes: Mapping[str, str] | None = None) -> None:
        """After the rollout phase (scored samples, before any update). ``notes``: the first
        failure's text per breaker name, if known."""
        for breaker in _FRACTION_BREAKERS:
            limit = getattr(self.limits, breaker.limit_field)
            counts = breaker.counts(metrics)
            if limit is None or counts is None:
                continue
            failed, total = round(counts[0]), round(counts[1])
            if total > 0 and failed / total >= limit:
                note = (notes or {}).get(breaker.name)
                raise CircuitBreakerError(
                    f"circuit breaker '{breaker.name}': {failed} of {total} {breaker.failed} in step {step}"
                    + (f" (first: {note})" if note else "") + f", so the run stopped rather than train on them. "
                    f"{breaker.fix[0].upper()}{breaker.fix[1:]}; or allow more failures with {breaker.key} "
                    f"(now {limit:g}: stop when that fraction fails; null: never stop). {RESUME}"
                )

    def check_update(self, metrics: Mapping[str, Metric], step: int) -> None:
        """After the updates: count the steps in a row whose every actor (or critic) update was skipped
        (``<role>/skipped``, the mean over the step's updates of 1 for a skipped one, is 1)."""
        skipped = [role for role in ("actor", "critic") if f"{role}/skipped" in metrics and metrics[f"{role}/skipped"].value >= 1.0]
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        limit = self.limits.skipped_steps
        if limit and self.skipped_in_a_row >= limit:
            raise CircuitBreakerError(
                f"circuit breaker 'non-finite': the {' and '.join(skipped)}'s gradient was not finite (inf or nan) in "
                f"every update of {self.skipped_in_a_row} steps in a row (steps {step - self.skipped_in_a_row + 1} to "
                f"{step}), so the weights have not moved since. Lower the learning rate "
                "(actor_rollout_ref.actor.optim.lr), check the rewards for huge values, train in float32 "
                f"(actor_rollout_ref.actor.dtype=float32); or allow more with trainer.stop_after_skipped_steps "
                f"(now {limit}; 0: never stop). {RESUME}"
            )
