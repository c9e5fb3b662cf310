"""Slow, obvious references for rollout-engine tests."""

from collections.abc import Sequence

import torch


def forward_logprobs(
    model,
    prompt: Sequence[int],
    response: Sequence[int],
    temperature: float = 1.0,
    top_k: int | None = None,
) -> torch.Tensor:
    """Log-prob of each response token given everything before it, shape ``(len(response),)``.

    The distribution is the tempered softmax restricted to the ``top_k`` largest logits (the one a
    token is sampled from), computed from one full forward pass over prompt + response.
    """
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / temperature
    if top_k is not None:
        kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, torch.tensor(response)[:, None])[:, 0]


def first_stop_string_end(tokens: Sequence[int], stop: str, decode) -> int | None:
    """Length of the shortest prefix of ``tokens`` whose text contains ``stop`` (None if none)."""
    for length in range(1, len(tokens) + 1):
        if stop in decode(tokens[:length]):
            return length
    return None
