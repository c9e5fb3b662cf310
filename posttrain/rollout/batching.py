"""Token sequences → a padded training Batch: the one builder every caller uses.

The rollout engine speaks token lists (each prompt's real tokens in, each response's sampled tokens
and behaviour logprobs out); the training engine wants a padded Batch (layout in
:mod:`posttrain.engines.training.inputs`). :func:`sequences_to_batch` is the only place one becomes
the other: single-turn responses, multi-turn episodes (agent tokens and observations), SFT
transcripts. Prompts are left-padded to the longest prompt, responses right-padded to a fixed
width (``max_response_length`` in RL, so that pieces from different ranks or generators
concatenate). :func:`join_rollouts` concatenates Batches whose prompt widths differ (an
asynchronous batch's units) by left-padding in tensor space: the rows are not un-padded and rebuilt.

Also here: prompts as token lists for the engine, and groups (each prompt repeated ``n`` times).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from posttrain import keys
from posttrain.agents.loop import turn_logprobs
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.protocol import Batch, pad_rows

# whose prompt columns a join left-pads: (key, pad value)
_PROMPT_SIDE = ((keys.PROMPT_IDS, None), (keys.PROMPT_MASK, 0), (keys.INPUT_IDS, None), (keys.ATTENTION_MASK, 0), (keys.POSITION_IDS, 0))

REWARD_EXTRA = "reward_extra/"  # a score function's values besides the score, one column each (rewards/manager.py)


def sequences_to_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_token_id: int, response_width: int | None = None,
    loss_masks: Sequence[Sequence[int]] | None = None, logprobs: Sequence[Sequence[float]] | None = None,
) -> Batch:
    """Prompts and responses (token ids, one pair per row) as model inputs.

    Returns INPUT_IDS, ATTENTION_MASK, POSITION_IDS, RESPONSE_IDS (B, P + T / T), PROMPT_IDS and
    PROMPT_MASK (B, P), RESPONSE_MASK (B, T) — the loss mask: ``loss_masks`` where a response holds
    tokens that carry no loss (observations), else 1 on every response token — and
    BEHAVIOUR_LOGPROBS (B, T, 0 on padding) when ``logprobs`` are given. T is ``response_width``
    (a longer response is refused) or the longest response.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; they must pair up")
    longest = max((len(r) for r in responses), default=0)
    width = longest if response_width is None else response_width
    if longest > width:
        row = next(i for i, r in enumerate(responses) if len(r) > width)
        raise ValueError(f"response {row} has {len(responses[row])} tokens, more than max_response_length={width}")
    prompt_width = max(len(p) for p in prompts)
    prompt_ids = pad_rows(prompts, prompt_width, pad_token_id, left=True)
    prompt_mask = pad_rows([[1] * len(p) for p in prompts], prompt_width, left=True)
    response_ids = pad_rows(responses, width, pad_token_id)
    attention = pad_rows([[1] * len(r) for r in responses], width)
    tensors = build_model_inputs(prompt_ids, prompt_mask, response_ids, attention)
    tensors |= {
        keys.PROMPT_IDS: prompt_ids, keys.PROMPT_MASK: prompt_mask,
        keys.RESPONSE_MASK: attention if loss_masks is None else pad_rows(loss_masks, width),
    }
    if logprobs is not None:
        tensors[keys.BEHAVIOUR_LOGPROBS] = pad_rows(logprobs, width, dtype=torch.float32)
    return Batch.from_dict(tensors)


def responses_to_batch(prompts: Batch, sampled: Batch, *, max_response_length: int, pad_token_id: int) -> Batch:
    """What ``actor.generate`` sampled for ``prompts`` (one response per row, as token lists) as the
    model inputs, RESPONSE_MASK, BEHAVIOUR_LOGPROBS and FINISH_REASON to add to those rows; meta
    WEIGHT_VERSION, the weights that sampled them. Each response needs its engine's logprob for every token
    (``turn_logprobs``, as an agent's turns do; ValueError naming the row otherwise)."""
    logprobs = []
    for row, (tokens, sampled_logprobs) in enumerate(zip(sampled[keys.TURN_TOKEN_IDS], sampled[keys.TURN_LOGPROBS], strict=True)):
        try:
            logprobs.append(turn_logprobs(tokens, sampled_logprobs))
        except ValueError as err:
            raise ValueError(f"response {row}: {err}") from err
    responses = sequences_to_batch(
        prompt_token_lists(prompts), sampled[keys.TURN_TOKEN_IDS], pad_token_id=pad_token_id, response_width=max_response_length,
        logprobs=logprobs,
    )
    responses.non_tensors[keys.FINISH_REASON] = np.asarray(sampled[keys.FINISH_REASON], dtype=object)
    responses.meta[keys.WEIGHT_VERSION] = sampled.meta.get(keys.WEIGHT_VERSION, 0)
    return responses


def join_rollouts(batches: Sequence[Batch], pad_token_id: int) -> Batch:
    """Concatenate rollouts whose prompts were padded to different widths: each one's prompt-side
    columns are left-padded to the widest (position ids of padding are 0, as the builder makes them).

    A non-tensor column that only some pieces have is filled on the others' rows: a score function's
    extra values (``reward_extra/...``) are missing from a piece where no sample was scored (every answer
    unreadable, or every call failed), NaN there as for one unscored sample; in a mixture's batch
    (rollout/mixture.py) an episode's columns (its transcript, counters) are None on single-turn rows, and
    EPISODE_IDS (a program's) names each other row an episode of its own. Tensors must agree."""
    width = max(b[keys.PROMPT_IDS].shape[1] for b in batches)
    examples = {key: batch.non_tensors[key] for batch in batches for key in batch.non_tensors}
    tensor_keys = {key for batch in batches for key in batch.tensors}
    padded = []
    for index, batch in enumerate(batches):
        missing = sorted(tensor_keys - set(batch.tensors))
        if missing:
            raise ValueError(f"rollout piece {index} lacks the tensors {missing} that another piece has; pieces to join must make the same tensors")
        extra = width - batch[keys.PROMPT_IDS].shape[1]
        tensors = dict(batch.tensors)
        for key, value in _PROMPT_SIDE:
            tensors[key] = F.pad(batch[key], (extra, 0), value=pad_token_id if value is None else value)
        non_tensors = dict(batch.non_tensors)
        for key, example in examples.items():
            if key not in non_tensors:
                non_tensors[key] = _filler(key, example, len(batch))
        padded.append(Batch(tensors, non_tensors, {}))
    return Batch.concat(padded)


def _filler(key: str, example: np.ndarray, rows: int) -> np.ndarray:
    """What a piece without column ``key`` holds there (:func:`join_rollouts`)."""
    if key == keys.EPISODE_IDS:  # unique across joins too (dynamic sampling's rounds, an asynchronous batch's units)
        return np.array([uuid.uuid4().hex for _ in range(rows)], dtype=object)
    if example.dtype != object:
        return np.full(rows, np.nan)
    return np.array([None] * rows, dtype=object)


def sample_accuracy(batch: Batch) -> np.ndarray:
    """Each sample's accuracy: ``reward_extra/acc`` where the score function reported it, else score > 0
    (so a sample it could not score, an error or an unreadable answer, is 0 and never NaN)."""
    scores = batch[keys.TOKEN_SCORES].sum(-1).numpy()
    positive = (scores > 0).astype(float)
    if "reward_extra/acc" not in batch:
        return positive
    acc = np.array([np.nan if value is None else float(value) for value in batch["reward_extra/acc"]], dtype=float)
    return np.where(np.isnan(acc), positive, acc)


def prompt_token_lists(batch: Batch) -> list[list[int]]:
    """Each row's real prompt tokens (PROMPT_IDS without the left padding)."""
    ids, mask = batch[keys.PROMPT_IDS], batch[keys.PROMPT_MASK].bool()
    return [row[row_mask].tolist() for row, row_mask in zip(ids, mask)]


def repeat_for_groups(batch: Batch, n: int) -> Batch:
    """Each prompt ``n`` times, interleaved (a group stays contiguous), with GROUP_IDS from its UID."""
    repeated = batch.repeat(n, interleave=True)
    return repeated.union(Batch.from_dict({keys.GROUP_IDS: group_ids_of(repeated[keys.UID])}))


def group_ids_of(uids) -> torch.Tensor:
    """(B,) group number of each row: rows with the same prompt UID share one, numbered in order of appearance."""
    index = {uid: i for i, uid in enumerate(dict.fromkeys(list(uids)))}
    return torch.tensor([index[u] for u in uids], dtype=torch.long)
