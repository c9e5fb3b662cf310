"""DAPO's reward shaping and sampling signals: pure functions over per-sequence tensors.

| function                | what |
|-------------------------|------|
| `overlong_penalty`      | 0 up to ``max_length − buffer`` tokens, then linearly down to ``−factor`` at ``max_length`` |
| `rows_of_varied_groups` | the rows whose group's rewards are not all equal (the groups dynamic sampling keeps) |
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["overlong_penalty", "rows_of_varied_groups"]


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float) -> Tensor:
    """``min(0, −(L − (max_length − buffer)) / buffer · factor)`` per response of length L.  # (B,) -> (B,) float32"""
    if not 1 <= buffer <= max_length:
        raise ValueError(f"the overlong buffer must be in [1, {max_length}] tokens, got {buffer}")
    excess = lengths.float() - (max_length - buffer)
    return torch.clamp(-excess / buffer * factor, max=0.0)


def rows_of_varied_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """True on the rows of groups whose rewards are not all equal.  # (B,), (B,) -> (B,) bool"""
    groups = torch.unique(group_ids)
    varied = torch.zeros_like(group_ids, dtype=torch.bool)
    for group in groups:
        rows = group_ids == group
        values = rewards[rows]
        varied[rows] = bool((values != values[0]).any())
    return varied
