"""How sure an accuracy is: a 95 % Wilson interval for each accuracy a validation reports, and a
paired bootstrap interval for the difference of two evaluations of the same items.

An accuracy ``val/<source>/acc/<stat>@n`` comes with ``val/<source>/acc_low/<stat>@n`` and
``acc_high`` (:func:`interval_metrics`): the Wilson score interval of its successes over its trials
(every sample for ``mean@n``; every prompt for ``best@n`` and ``maj@n``, which are per prompt; with
n > 1 the samples of one prompt are not independent, so ``mean@n``'s interval is then too narrow:
the default validation samples once, greedy). On
64 items an accuracy of 0.50 is [0.38, 0.62]: a +7 point gain on such a set is inside the noise,
which the paired interval of the difference (:func:`paired_difference`, ``posttrain compare``) says
directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95


def wilson(successes: float, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` (rounded to a whole number) out of ``trials``."""
    from scipy.stats import binomtest

    if trials <= 0:
        return math.nan, math.nan
    interval = binomtest(min(trials, max(0, round(successes))), trials).proportion_ci(confidence, method="wilson")
    return float(interval.low), float(interval.high)


def interval_names(name: str) -> tuple[str, str]:
    """``val/x/acc/mean@1`` → (``val/x/acc_low/mean@1``, ``val/x/acc_high/mean@1``)."""
    return name.replace("/acc/", "/acc_low/", 1), name.replace("/acc/", "/acc_high/", 1)


def interval_metrics(name: str, successes: float, trials: int) -> dict[str, float]:
    low, high = wilson(successes, trials)
    low_name, high_name = interval_names(name)
    return {low_name: low, high_name: high}


def with_interval(metrics: Mapping[str, float], name: str) -> str:
    """``0.700 [0.521, 0.833]``: the accuracy and its interval when ``metrics`` hold one."""
    low, high = (metrics.get(key) for key in interval_names(name))
    text = f"{metrics[name]:.3f}"
    return f"{text} [{low:.3f}, {high:.3f}]" if low is not None and high is not None else text


def paired_difference(first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE,
                      resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean of second − first, low, high): the percentile bootstrap of the mean per-item difference,
    items resampled together (paired), so what both evaluations share cancels out."""
    from scipy.stats import bootstrap

    differences = np.asarray(second, dtype=float) - np.asarray(first, dtype=float)
    if len(differences) == 0:
        raise ValueError("no items in common to compare")
    mean = float(differences.mean())
    if np.all(differences == differences[0]):  # nothing to resample: the interval is the value
        return mean, mean, mean
    result = bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                       random_state=np.random.default_rng(seed))
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)
