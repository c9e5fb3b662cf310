"""Shared test inputs for posttrain.algos: random masks shaped like real responses."""

from __future__ import annotations

import torch
from torch import Tensor

# Small shapes (B, T): a single token, a typical small batch, and a longer ragged one.
SHAPES = [(1, 1), (3, 5), (8, 13)]


def random_mask(batch: int, length: int, generator: torch.Generator, *, holes: bool = True) -> Tensor:
    """(B, T) float mask: ragged lengths, the last row empty when B > 1, and (with `holes`)
    zeros inside a response, like the observation tokens of a multi-turn episode."""
    mask = torch.zeros(batch, length)
    for row in range(batch):
        valid = int(torch.randint(1, length + 1, (1,), generator=generator))
        mask[row, :valid] = 1.0
        if holes and valid > 2:
            start = int(torch.randint(1, valid - 1, (1,), generator=generator))
            mask[row, start : start + 1 + (valid > 4)] = 0.0
    if batch > 1:
        mask[-1] = 0.0
    return mask


def rows(mask: Tensor) -> list[list[int]]:
    """Valid positions of each row, as plain lists, for loop references."""
    return [[t for t, m in enumerate(row) if m != 0] for row in mask.tolist()]
