"""Splitting a Batch into micro-batches: by sample count, or by a token budget (dynamic batch size).

Both return groups of row indices, so a result computed per micro-batch can be put back in the
original order (:func:`scatter_rows`).

Token budget. Each sample costs its real (attended) tokens, prompt plus response. Samples are
packed first-fit-decreasing (longest first, each into the first micro-batch with room), so every
micro-batch holds at most ``max_tokens`` real tokens and samples of similar length end up
together, which keeps the padding of each micro-batch (trimmed to its longest row) small.

Shared prompts. When the engine runs a group's prompt once (``packing.shared_prompt_layout``), a
micro-batch should hold whole groups, and what it costs is one prompt plus the group's responses:
:func:`split_units_by_token_budget` packs groups by that cost, and splits a group larger than the
budget into pieces, each repeating the prompt.

Equal counts across ranks. Under FSDP every forward pass gathers parameters with a collective,
so every rank must run the same number of micro-batches. :func:`equalize_group_count` splits the
largest groups until there are ``count`` of them; when a rank has fewer samples than that, it adds
empty groups, which the engine runs as zero-weight padding micro-batches.
"""

from __future__ import annotations

import torch
from torch import Tensor


def split_by_count(num_samples: int, micro_batch_size: int | None) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` rows (the last may be smaller); None: one group."""
    if micro_batch_size is None:
        return [list(range(num_samples))]
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    starts = range(0, num_samples, micro_batch_size)
    return [list(range(start, min(start + micro_batch_size, num_samples))) for start in starts]


def split_by_token_budget(token_counts: Tensor, max_tokens: int) -> list[list[int]]:
    """Groups of rows whose ``token_counts`` sum to at most ``max_tokens`` (first-fit decreasing).

    Raises ValueError naming the sample when one alone exceeds the budget.
    """
    counts = token_counts.tolist()
    if counts and max(counts) > max_tokens:
        longest = max(range(len(counts)), key=counts.__getitem__)
        raise ValueError(
            f"sample {longest} has {counts[longest]} real tokens, more than the micro-batch token budget "
            f"max_tokens={max_tokens}; raise the budget (ppo_max_token_len_per_gpu) to at least the longest "
            "prompt + response"
        )
    groups: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        for slot, load in enumerate(loads):
            if load + counts[row] <= max_tokens:
                groups[slot].append(row)
                loads[slot] += counts[row]
                break
        else:
            groups.append([row])
            loads.append(counts[row])
    return [sorted(group) for group in groups]


def split_units_by_token_budget(
    prompt_lengths: list[int], response_lengths: list[int], units: list[int], max_tokens: int
) -> list[list[int]]:
    """Micro-batches of rows, each costing at most ``max_tokens`` with one prompt per unit in it.

    ``units[i]`` numbers row i's prompt group (rows of a unit share their prompt). A unit whose
    prompt plus responses exceeds the budget is cut into pieces (longest responses first, each piece
    filled as far as it goes), each piece paying for the prompt again. The pieces are then packed
    first-fit decreasing, as :func:`split_by_token_budget` packs samples.
    """
    sizes = [p + r for p, r in zip(prompt_lengths, response_lengths)]
    if sizes and max(sizes) > max_tokens:
        split_by_token_budget(torch.tensor(sizes), max_tokens)  # raises, naming the sample
    pieces: list[list[int]] = []
    costs: list[int] = []
    members: dict[int, list[int]] = {}
    for row, unit in enumerate(units):
        members.setdefault(unit, []).append(row)
    for rows in members.values():
        prompt = prompt_lengths[rows[0]]
        start = len(pieces)
        for row in sorted(rows, key=lambda i: (-response_lengths[i], i)):
            for k in range(start, len(pieces)):
                if costs[k] + response_lengths[row] <= max_tokens:
                    pieces[k].append(row)
                    costs[k] += response_lengths[row]
                    break
            else:
                pieces.append([row])
                costs.append(prompt + response_lengths[row])
    packed = split_by_token_budget(torch.tensor(costs, dtype=torch.long), max_tokens)
    return [sorted(row for piece in group for row in pieces[piece]) for group in packed]


def equalize_group_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` split (largest first, in halves) until there are ``count``; [] pads when rows run out."""
    if count < len(groups):
        raise ValueError(f"cannot reduce {len(groups)} micro-batches to {count}")
    groups = [list(g) for g in groups]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[largest]) < 2:
            groups.append([])
            continue
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def scatter_rows(pieces: list[Tensor], groups: list[list[int]], num_samples: int) -> Tensor:
    """Rows of ``pieces[k]`` put back at ``groups[k]`` in a tensor of ``num_samples`` rows."""
    real = [(piece, group) for piece, group in zip(pieces, groups) if group]
    first = real[0][0]
    out = torch.zeros((num_samples, *first.shape[1:]), dtype=first.dtype, device=first.device)
    for piece, group in real:
        out[torch.tensor(group, device=first.device)] = piece
    return out
