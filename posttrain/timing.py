"""Wall time per named phase of a step (``timing_s/<phase>`` in the metrics)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed(timings_s: dict[str, float], phase: str) -> Iterator[None]:
    """Adds the seconds the block took to ``timings_s[phase]``."""
    start = time.perf_counter()
    yield
    timings_s[phase] = timings_s.get(phase, 0.0) + time.perf_counter() - start
