"""Where a micro-batch's tokens go in the model's input, and which outputs score its responses.

A Batch row is a left-padded prompt and a right-padded response (``inputs``). The model can take
it two ways; both give a :class:`Layout`, and the forward pass reads the same scored outputs from
either, so the results agree to rounding (the packed path is tested against the padded one).

Padded (``padded_layout``): the rows as they are, cut to the columns some row attends. A row
costs the micro-batch's longest prompt plus its longest response, whatever its own lengths.

Packed (``packed_layout``, the default; verl's ``use_remove_padding``): each sample's real tokens
only, placed end to end in rows as wide as the longest sample (first-fit decreasing, longest
first), with position ids counted from 0 in each sample and no attention mask. transformers reads
such position ids as packed sequences and gives each sample a causal mask of its own
(``masking_utils.find_packed_sequence_indices``), so no token attends to another sample's. The
few columns left at a row's end are filler of their own (positions from 0), never scored. Rows
as wide as the longest sample, not one long row, keep the attention's (width x width) scores no
larger than the padded layout's. Flash-attention kernels read packing from the position ids of
one row only, so for those every sample goes in one row.

Shared prompt (``shared_prompt_layout``, the default where the model allows it): the samples of a
micro-batch that have the same prompt (a GRPO group, an agent's episodes from one row) are one
*unit*: the prompt's tokens once, then each sample's response after it. Each response token attends
to the prompt and to its own response's earlier tokens only, with positions continuing from the
prompt (p, p+1, ...), so it computes exactly what it would behind its own copy of the prompt; the
prompt's outputs are computed once and get the gradient of every response. Position-id packing
cannot say this (a reset would cut a response off from its prompt), so the layout carries an explicit
(rows, 1, width, width) mask, which transformers' masking utilities pass to the attention kernels as
it is (a 4D ``attention_mask`` is taken as prepared): boolean for sdpa, additive (0 or the float
minimum) for eager. Units are placed in rows like packed samples (first-fit decreasing, rows as wide
as the longest unit); a unit's first response token is scored by the prompt's last output. Where no
two samples share a prompt it is the packed layout.

Scored outputs: response token t of sample i is predicted by the output at the position before
it. ``Layout.scored`` lists, for each response token the model saw (response attention mask 1),
that position as a flat index into the (rows x width) outputs; ``Layout.samples`` and
``Layout.columns`` say where its result goes in the (b, T) result; ``Layout.labels`` is the token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain import keys
from posttrain.engines.training.inputs import prompt_groups, response_attention_mask
from posttrain.protocol import Batch


@dataclass(frozen=True)
class Layout:
    """A micro-batch laid out for the model (module docstring); N = scored response tokens."""

    inputs: dict[str, Tensor]  # input_ids, position_ids (rows, width), and attention_mask when padded
    scored: Tensor  # (N,) flat index into the (rows * width) outputs: the position that predicts the token
    samples: Tensor  # (N,) the token's sample (row of the micro-batch)
    columns: Tensor  # (N,) its response column
    labels: Tensor  # (N,) the token id
    real_tokens: int  # tokens the samples hold (prompt + response, attended)
    width: int  # columns of the model input

    @property
    def rows(self) -> int:
        return self.inputs["input_ids"].shape[0]


def _response_tokens(micro_batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    # (samples, columns, labels) of every response token the model saw, in row-major order.
    seen = response_attention_mask(micro_batch) != 0
    samples, columns = seen.nonzero(as_tuple=True)
    return samples, columns, micro_batch[keys.RESPONSE_IDS][samples, columns]


def padded_layout(micro_batch: Batch) -> Layout:
    """The rows as they are, cut to the columns some row attends (module docstring)."""
    input_ids, attention_mask = micro_batch[keys.INPUT_IDS], micro_batch[keys.ATTENTION_MASK]
    prompt_length = input_ids.shape[1] - micro_batch[keys.RESPONSE_IDS].shape[1]
    # [start, end): the attended columns, keeping the last prompt column (it predicts the first
    # response token) and at least one response column.
    real = attention_mask.any(dim=0).nonzero().flatten().tolist()
    start = min(real[0], prompt_length - 1) if real else prompt_length - 1
    end = max(real[-1] + 1, prompt_length + 1) if real else prompt_length + 1
    columns = slice(start, end)
    samples, response_columns, labels = _response_tokens(micro_batch)
    width = end - start
    scored = samples * width + (prompt_length - 1 - start) + response_columns
    return Layout(
        inputs={
            "input_ids": input_ids[:, columns],
            "attention_mask": attention_mask[:, columns],
            "position_ids": micro_batch[keys.POSITION_IDS][:, columns],
        },
        scored=scored, samples=samples, columns=response_columns, labels=labels,
        real_tokens=int(attention_mask.sum()), width=width,
    )


def packed_layout(micro_batch: Batch, *, one_row: bool = False) -> Layout:
    """Each sample's real tokens end to end in rows as wide as the longest (module docstring).

    ``one_row``: every sample in a single row (flash-attention kernels). Raises ValueError for a
    sample whose attended tokens are not one run or that has no prompt token.
    """
    input_ids = micro_batch[keys.INPUT_IDS]
    prompt_length, lengths, prompt_lengths, firsts = _sample_runs(micro_batch)

    sizes = lengths.tolist()
    width = sum(sizes) if one_row else max(sizes)
    slots = _first_fit_decreasing(sizes, width)
    rows = max(row for row, _ in slots) + 1
    packed_ids = torch.zeros((rows, width), dtype=input_ids.dtype, device=input_ids.device)
    positions = torch.zeros((rows, width), dtype=torch.long, device=input_ids.device)
    loads = [0] * rows
    starts = []  # flat index of each sample's first token
    for sample, (row, offset) in enumerate(slots):
        first, size = int(firsts[sample]), sizes[sample]
        packed_ids[row, offset:offset + size] = input_ids[sample, first:first + size]
        positions[row, offset:offset + size] = torch.arange(size, device=input_ids.device)
        loads[row] = max(loads[row], offset + size)
        starts.append(row * width + offset)
    for row, load in enumerate(loads):  # filler after the last sample: a sequence of its own
        positions[row, load:] = torch.arange(width - load, device=input_ids.device)

    samples, response_columns, labels = _response_tokens(micro_batch)
    starts_t = torch.tensor(starts, dtype=torch.long, device=input_ids.device)
    scored = starts_t[samples] + prompt_lengths[samples] - 1 + response_columns
    return Layout(
        inputs={"input_ids": packed_ids, "position_ids": positions},
        scored=scored, samples=samples, columns=response_columns, labels=labels,
        real_tokens=int(lengths.sum()), width=width,
    )


def shared_prompt_layout(micro_batch: Batch, *, mask_dtype: torch.dtype = torch.bool) -> Layout:
    """The samples that share a prompt as one unit, the prompt once and the responses after it
    (module docstring). ``mask_dtype``: torch.bool (sdpa) or a float dtype (eager's additive mask)."""
    groups = prompt_groups(micro_batch)
    if len(groups) == len(set(groups.tolist())):
        return packed_layout(micro_batch)
    input_ids = micro_batch[keys.INPUT_IDS]
    prompt_length, lengths, prompt_lengths, firsts = _sample_runs(micro_batch)

    members = [(groups == g).nonzero().flatten().tolist() for g in range(int(groups.max()) + 1)]
    response_lengths = (lengths - prompt_lengths).tolist()
    unit_sizes = [int(prompt_lengths[m[0]]) + sum(response_lengths[s] for s in m) for m in members]
    width = max(unit_sizes)
    slots = _first_fit_decreasing(unit_sizes, width)
    rows = max(row for row, _ in slots) + 1
    packed_ids = torch.zeros((rows, width), dtype=input_ids.dtype)
    positions = torch.zeros((rows, width), dtype=torch.long)
    # per column: its unit (filler: a unit of its own) and its part (0: the prompt, k: response k)
    units = torch.arange(rows * width, dtype=torch.long).reshape(rows, width) + len(members)
    parts = torch.zeros((rows, width), dtype=torch.long)
    prompt_ends, response_starts = [0] * len(groups), [0] * len(groups)  # flat indices per sample
    for unit, (sample_rows, (row, offset)) in enumerate(zip(members, slots)):
        first, size = int(firsts[sample_rows[0]]), int(prompt_lengths[sample_rows[0]])
        packed_ids[row, offset:offset + size] = input_ids[sample_rows[0], first:first + size]
        positions[row, offset:offset + size] = torch.arange(size)
        units[row, offset:offset + unit_sizes[unit]] = unit
        cursor = offset + size
        for part, sample in enumerate(sample_rows, start=1):
            length = response_lengths[sample]
            packed_ids[row, cursor:cursor + length] = input_ids[sample, prompt_length:prompt_length + length]
            positions[row, cursor:cursor + length] = torch.arange(size, size + length)
            parts[row, cursor:cursor + length] = part
            prompt_ends[sample], response_starts[sample] = row * width + offset + size - 1, row * width + cursor
            cursor += length

    samples, response_columns, labels = _response_tokens(micro_batch)
    on_cpu = samples.cpu(), response_columns.cpu()
    prompt_ends_t, response_starts_t = torch.tensor(prompt_ends), torch.tensor(response_starts)
    scored = torch.where(on_cpu[1] == 0, prompt_ends_t[on_cpu[0]], response_starts_t[on_cpu[0]] + on_cpu[1] - 1)
    return Layout(
        inputs={
            "input_ids": packed_ids.to(input_ids.device),
            "position_ids": positions.to(input_ids.device),
            "attention_mask": _unit_mask(units, parts, mask_dtype).to(input_ids.device),
        },
        scored=scored.to(input_ids.device), samples=samples, columns=response_columns, labels=labels,
        real_tokens=sum(unit_sizes), width=width,
    )


def _unit_mask(units: Tensor, parts: Tensor, dtype: torch.dtype) -> Tensor:
    # (rows, 1, width, width): query i sees key j when j <= i in the same unit and j is prompt or i's own part
    width = units.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same_unit = units.unsqueeze(2) == units.unsqueeze(1)
    visible_part = (parts.unsqueeze(1) == 0) | (parts.unsqueeze(2) == parts.unsqueeze(1))
    allowed = (same_unit & visible_part & causal).unsqueeze(1)
    if dtype == torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def _sample_runs(micro_batch: Batch) -> tuple[int, Tensor, Tensor, Tensor]:
    """(prompt columns P, each sample's attended tokens, its prompt tokens, its first column), checked."""
    attention_mask = micro_batch[keys.ATTENTION_MASK] != 0
    prompt_length = attention_mask.shape[1] - micro_batch[keys.RESPONSE_IDS].shape[1]
    lengths = attention_mask.sum(dim=1)
    prompt_lengths = attention_mask[:, :prompt_length].sum(dim=1)
    firsts = attention_mask.int().argmax(dim=1)
    _check_runs(attention_mask, lengths, prompt_lengths, firsts, prompt_length)
    return prompt_length, lengths, prompt_lengths, firsts


def _check_runs(attention_mask: Tensor, lengths: Tensor, prompt_lengths: Tensor, firsts: Tensor, prompt_length: int) -> None:
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    run = (columns >= firsts.unsqueeze(1)) & (columns < (firsts + lengths).unsqueeze(1))
    broken = ((run != attention_mask).any(dim=1) | (lengths == 0)).nonzero().flatten().tolist()
    if broken:
        raise ValueError(
            f"sample {broken[0]}'s attended tokens are not one run of columns; packing needs a left-padded "
            "prompt followed by a right-padded response (posttrain.engines.training.build_model_inputs)"
        )
    ends_in_prompt = (firsts + prompt_lengths) != prompt_length
    empty = ((prompt_lengths == 0) | ends_in_prompt).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"sample {empty[0]} has no prompt token right before its response; the first response token is "
            "scored by the position before it, so every sample needs at least one prompt token"
        )


def _first_fit_decreasing(sizes: list[int], width: int) -> list[tuple[int, int]]:
    # (row, offset) of each sample: longest first, each into the first row with room.
    loads: list[int] = []
    slots: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    for sample in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for row, load in enumerate(loads):
            if load + sizes[sample] <= width:
                slots[sample] = (row, load)
                loads[row] += sizes[sample]
                break
        else:
            slots[sample] = (len(loads), 0)
            loads.append(sizes[sample])
    return slots
