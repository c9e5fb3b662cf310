"""Model inputs from prompt and response ids, and the checks the engine runs on every Batch.

Layout (see :mod:`posttrain.keys`): a row of ``input_ids`` (B, L) is the left-padded prompt (P
columns) followed by the right-padded response (T columns), L = P + T:

    input_ids       [pad pad p0 p1 p2 | r0 r1 r2 pad]
    attention_mask  [ 0   0  1  1  1  |  1  1  1  0 ]
    position_ids    [ 0   0  0  1  2  |  3  4  5  5 ]     counting real tokens only

The response's attention mask is 1 on every response token the model saw, including observation
tokens of a multi-turn episode that carry no loss (those have ``response_mask`` 0 but attention 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain import keys
from posttrain.protocol import Batch

MODEL_INPUT_KEYS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSE_IDS)


def lengths_to_mask(lengths: Tensor, width: int, *, left_padded: bool) -> Tensor:
    """1 on the first (right padding) or last (left padding) ``lengths[i]`` columns.  # (B,) -> (B, width) int64"""
    columns = torch.arange(width, device=lengths.device).unsqueeze(0)
    if left_padded:
        return (columns >= width - lengths.unsqueeze(1)).long()
    return (columns < lengths.unsqueeze(1)).long()


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions counting real tokens only; padding before the first token gets 0.  # (B, L) -> (B, L)"""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def build_model_inputs(
    prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_attention_mask: Tensor
) -> dict[str, Tensor]:
    """INPUT_IDS, ATTENTION_MASK, POSITION_IDS and RESPONSE_IDS for a Batch.

    ``prompt_ids`` (B, P) left-padded with ``prompt_mask`` (B, P) 1 on real tokens;
    ``response_ids`` (B, T) right-padded with ``response_attention_mask`` (B, T) 1 on real tokens.
    """
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_attention_mask.shape:
        raise ValueError(
            f"ids and masks must have equal shapes: prompt {tuple(prompt_ids.shape)} vs "
            f"{tuple(prompt_mask.shape)}, response {tuple(response_ids.shape)} vs {tuple(response_attention_mask.shape)}"
        )
    if prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(f"{prompt_ids.shape[0]} prompts but {response_ids.shape[0]} responses; they must pair up")
    attention_mask = torch.cat([prompt_mask, response_attention_mask], dim=1).long()
    return {
        keys.INPUT_IDS: torch.cat([prompt_ids, response_ids], dim=1).long(),
        keys.ATTENTION_MASK: attention_mask,
        keys.POSITION_IDS: position_ids_from_mask(attention_mask),
        keys.RESPONSE_IDS: response_ids.long(),
    }


def random_model_inputs(
    prompt_lengths: Tensor, response_lengths: Tensor, prompt_width: int, response_width: int, *,
    vocab_size: int, generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Synthetic inputs for tests and benchmarks: uniform random ids (pad id 0) of the given lengths.

    Returns :func:`build_model_inputs`'s tensors plus RESPONSE_MASK (float, 1 on response tokens).
    """
    prompt_mask = lengths_to_mask(prompt_lengths, prompt_width, left_padded=True)
    response_attention = lengths_to_mask(response_lengths, response_width, left_padded=False)
    prompt_ids = torch.randint(1, vocab_size, (len(prompt_lengths), prompt_width), generator=generator) * prompt_mask
    response_ids = torch.randint(1, vocab_size, (len(response_lengths), response_width), generator=generator)
    tensors = build_model_inputs(prompt_ids, prompt_mask, response_ids * response_attention, response_attention)
    tensors[keys.RESPONSE_MASK] = response_attention.float()
    return tensors


def check_batch(batch: Batch, required: Sequence[str], purpose: str) -> None:
    """Raise KeyError naming every missing key, or ValueError for inconsistent shapes."""
    missing = [k for k in required if k not in batch.tensors]
    if missing:
        raise KeyError(
            f"{purpose} needs Batch tensors {missing}, which are missing (the Batch has {sorted(batch.keys())}); "
            "build the model inputs with posttrain.engines.training.build_model_inputs"
        )
    length = batch[keys.INPUT_IDS].shape[1]
    for key in (keys.ATTENTION_MASK, keys.POSITION_IDS):
        if batch[key].shape != batch[keys.INPUT_IDS].shape:
            raise ValueError(
                f"{key} has shape {tuple(batch[key].shape)}, input_ids {tuple(batch[keys.INPUT_IDS].shape)}; they must match"
            )
    response_length = batch[keys.RESPONSE_IDS].shape[1]
    if not 0 < response_length < length:
        raise ValueError(
            f"responses has {response_length} columns and input_ids {length}: the response must be the "
            "last columns of input_ids, after at least one prompt column"
        )
    if not torch.equal(batch[keys.INPUT_IDS][:, -response_length:], batch[keys.RESPONSE_IDS]):
        raise ValueError(
            "responses differ from the last columns of input_ids; the logprob of a response token is "
            "read at its place in input_ids, so both must hold the same ids (build_model_inputs does this)"
        )


def response_attention_mask(batch: Batch) -> Tensor:
    """1 on the response tokens the model saw (the last T columns of the attention mask).  # (B, T)"""
    response_length = batch[keys.RESPONSE_IDS].shape[1]
    return batch[keys.ATTENTION_MASK][:, -response_length:]


def real_token_counts(batch: Batch) -> Tensor:
    """Real (attended) tokens per sample, prompt and response.  # (B,) int64"""
    return batch[keys.ATTENTION_MASK].long().sum(dim=1)


def prompt_groups(batch: Batch) -> Tensor:
    """Samples with the same real prompt tokens share a number, in order of first appearance.  # (B,) int64

    A group's samples (``rollout.n`` responses to one prompt, or an agent's episodes from one row)
    have equal prompts whatever their GROUP_IDS say, so this reads the tokens themselves.
    """
    prompt_columns = batch[keys.INPUT_IDS].shape[1] - batch[keys.RESPONSE_IDS].shape[1]
    mask = (batch[keys.ATTENTION_MASK][:, :prompt_columns] != 0).long()
    # the mask beside the ids: a real token 0 is not padding
    prompts = torch.cat([batch[keys.INPUT_IDS][:, :prompt_columns] * mask, mask], dim=1)
    _, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    first_seen: dict[int, int] = {}
    return torch.tensor([first_seen.setdefault(int(g), len(first_seen)) for g in inverse.tolist()], dtype=torch.long)
