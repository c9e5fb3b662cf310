"""A metric that knows how it merges, declared where it is made.

The same metric is often made in several pieces that must become one number: per rank of a worker
group, per optimizer step of an update, per unit of an asynchronous batch, per round of dynamic
sampling, per batch of a validation. How the pieces combine depends on what the number is, not on
its name, so each :class:`Metric` carries its rule (:class:`Kind`):

    MEAN    a mean over ``count`` items; pieces weigh by their counts (a piece over 0 items weighs
            nothing, unless no piece has any: then each counts once)
    SUM     a count or a total (samples, failures, tokens, seconds waited); pieces add up
    MAX     the largest; MIN the smallest
    LAST    a running value as it stands after the last piece (a run's skipped-update total)

Whatever decides from metrics (the circuit breakers) reads SUM metrics for counts, never a mean
multiplied back by its count. A step's metrics are logged as plain floats (:func:`values`). Only
the standard library is used, so that every layer may make metrics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    MEAN = "mean"
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    LAST = "last"


@dataclass(frozen=True)
class Metric:
    value: float
    kind: Kind = Kind.MEAN
    count: float = 1.0  # MEAN only: how many items ``value`` is the mean of (its weight in a merge)


Metrics = dict[str, Metric]


def mean(value: float, count: float = 1.0) -> Metric:
    """The mean of ``count`` items (an optimizer step's loss: 1; a reward mean over 64 samples: 64)."""
    return Metric(float(value), Kind.MEAN, float(count))


def total(value: float) -> Metric:
    """A count or a sum: pieces add up."""
    return Metric(float(value), Kind.SUM)


def maximum(value: float) -> Metric:
    return Metric(float(value), Kind.MAX)


def minimum(value: float) -> Metric:
    return Metric(float(value), Kind.MIN)


def latest(value: float) -> Metric:
    """A running value (e.g. a total since the run began): the last piece's."""
    return Metric(float(value), Kind.LAST)


def combine(name: str, pieces: Sequence[Metric]) -> Metric:
    """One metric from its pieces, by their kind (which must agree)."""
    if not pieces:
        raise ValueError(f"metric {name!r}: nothing to combine")
    kinds = {piece.kind for piece in pieces}
    if len(kinds) > 1:
        raise ValueError(f"metric {name!r} is made as {sorted(k.value for k in kinds)} in different places; declare one kind")
    kind = pieces[0].kind
    if len(pieces) == 1:
        return pieces[0]
    values = [piece.value for piece in pieces]
    if kind is Kind.SUM:
        return total(sum(values))
    if kind is Kind.MAX:
        return maximum(max(values))
    if kind is Kind.MIN:
        return minimum(min(values))
    if kind is Kind.LAST:
        return pieces[-1]
    weights = [piece.count for piece in pieces] if any(piece.count > 0 for piece in pieces) else [1.0] * len(pieces)
    return mean(math.fsum(v * w for v, w in zip(values, weights)) / math.fsum(weights), sum(piece.count for piece in pieces))


def merge(parts: Iterable[Mapping[str, Metric]]) -> Metrics:
    """One metric per name over ``parts`` (ranks, steps, units, rounds, batches), each by its kind;
    a name missing from some parts is combined over the parts that have it."""
    pieces: dict[str, list[Metric]] = {}
    for part in parts:
        for name, metric in part.items():
            pieces.setdefault(name, []).append(metric)
    return {name: combine(name, found) for name, found in pieces.items()}


def merge_collected(collected: Mapping[str, Metric | Sequence[Metric]]) -> Metrics:
    """A worker group's metrics as collected from its ranks (``Batch.metrics``: a list per name, one
    piece per rank, or a single metric) as one metric each."""
    return {name: combine(name, list(found) if isinstance(found, Sequence) else [found]) for name, found in collected.items()}


def values(metrics: Mapping[str, Metric]) -> dict[str, float]:
    """What is logged: each metric's value."""
    return {name: metric.value for name, metric in metrics.items()}
