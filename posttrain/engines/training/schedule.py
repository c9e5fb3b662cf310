"""Learning-rate schedules: linear warmup, then constant or cosine decay to a floor.

The multiplier of the base learning rate for optimizer step ``s`` (0-based: the first update is
``s = 0``), with ``W = warmup_steps``, ``S = total_steps``, ``r = min_lr_ratio``:

    warmup   s < W:   (s + 1) / W                         the W-th update is the first at full lr
    constant s >= W:  1
    cosine   s >= W:  r + (1 - r) * (1 + cos(pi * p)) / 2,  p = min(1, (s - W) / max(1, S - W))

Unlike ``transformers``' schedules, warmup never gives an update at lr 0 (it would waste a step).
Only updates that were applied advance the schedule: a step skipped for a non-finite gradient
leaves it where it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR


@dataclass
class LRMultiplier:
    """The schedule as a picklable callable (LambdaLR saves its fields in ``state_dict``)."""

    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        if self.kind != "cosine":
            raise ValueError(f"unknown lr_scheduler {self.kind!r}; use 'constant' or 'cosine'")
        if self.total_steps is None:
            raise ValueError("the cosine schedule needs total_steps (optimizer steps to decay over)")
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    kind: str,
    *,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """A ``LambdaLR`` on ``optimizer`` following :class:`LRMultiplier`; call ``step()`` after each update."""
    return LambdaLR(optimizer, LRMultiplier(kind, warmup_steps, total_steps, min_lr_ratio))
