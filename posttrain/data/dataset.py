"""The RL prompt dataset: verl-format Parquet rows, chat-templated and tokenised once, up front.

Each prompt's chat messages go through the tokenizer's chat template with
``add_generation_prompt=True`` (so the model continues as the assistant) and are tokenised without
adding special tokens again (the template already holds them). All prompts are tokenised when the
dataset is built, because filtering overlong prompts needs every length, and because batches then
cost only a padding copy.

Prompts longer than ``max_prompt_length`` tokens are, in this order:
  1. dropped when ``filter_overlong_prompts`` is true (the count is logged and kept in
     :attr:`RLDataset.num_filtered`);
  2. otherwise handled by ``truncation``: ``"error"`` raises, naming the first such sample;
     ``"left"`` keeps the last ``max_prompt_length`` tokens (the generation prompt survives);
     ``"right"`` keeps the first ones.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.data.format import IN_SFT, RL_ONLY, PromptRow, read_rows
from posttrain.errors import InputError, PromptTooLongError
from posttrain.models import tokenize_prompts

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right")


@dataclass(frozen=True)
class PromptSample:
    """One prompt ready for batching."""

    prompt_ids: list[int]               # chat-templated token ids, at most max_prompt_length
    messages: list[dict[str, str]]      # the chat messages before templating
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    file: Path                          # where it was read, so a later check can name the row
    row: int                            # position within ``file``
    source: str = ""                    # a mixture's source (config/mixture.py); "" without one


class RLDataset:
    """Prompts from one or more verl-format Parquet files (concatenated in the order given).

    ``tokenizer`` is a Hugging Face tokenizer with a chat template and a pad token (as
    :func:`posttrain.models.load_tokenizer` returns). Indexing gives :class:`PromptSample`.
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int = 256,
        truncation: str = "error",
        filter_overlong_prompts: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_format: str = "auto",
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise InputError(f"truncation={truncation!r} (data.truncation) is not one of {TRUNCATION_MODES}")
        if max_prompt_length < 1:
            raise InputError(f"max_prompt_length={max_prompt_length} (data.max_prompt_length) must be at least 1")
        rows = read_rows(files, prompt_key)
        # tools: the run's schemas an agent may call, told in tool_format (env.tool_format); each row's own
        # (its extra_info.tools) are added to its prompt
        token_ids = tokenize_prompts([row.messages for row in rows], tokenizer, tools, [row.tools for row in rows], tool_format)
        kept = range(len(rows))
        if filter_overlong_prompts:
            kept = [i for i in kept if len(token_ids[i]) <= max_prompt_length]
            self.num_filtered = len(rows) - len(kept)
            if self.num_filtered:
                logger.warning(
                    "dropped %d of %d prompts longer than max_prompt_length=%d tokens",
                    self.num_filtered, len(rows), max_prompt_length,
                )
        else:
            self.num_filtered = 0
        self.samples = [
            _make_sample(rows[i], _fit(token_ids[i], i, rows[i], max_prompt_length, truncation)) for i in kept
        ]
        if not self.samples:
            raise InputError(
                f"no prompts left out of {len(rows)} in {sorted({str(r.file) for r in rows})}: all are longer "
                f"than max_prompt_length={max_prompt_length}; raise data.max_prompt_length"
            )
        self.max_prompt_length = max_prompt_length

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> PromptSample:
        return self.samples[index]

    def with_samples(self, samples: Sequence[PromptSample], num_filtered: int | None = None) -> RLDataset:
        """The same dataset holding ``samples`` instead (a split, a mixture's source, rows joined), the prompts
        already tokenised; ``num_filtered`` kept unless given."""
        other = copy.copy(self)
        other.samples = list(samples)
        if num_filtered is not None:
            other.num_filtered = num_filtered
        return other


def split_dev(dataset: RLDataset, size: int, seed: int) -> tuple[RLDataset, RLDataset]:
    """(the training rows, ``size`` development rows held back from them): a draw seeded by ``seed``, the
    same for the same rows and seed; each part keeps the rows' order. A row whose ``extra_info.in_sft`` is
    true (a preparer's mark: an SFT warm-up learnt its question) is never held back, so the development
    rows measure what the policy has not been taught; nor is one whose ``extra_info.rl_only`` is true (kept
    for RL alone beyond the warm-up data's cap), so the development rows stay those of the capped data."""
    candidates = [index for index, sample in enumerate(dataset.samples)
                  if not any((sample.extra_info or {}).get(mark) for mark in (IN_SFT, RL_ONLY))]
    if not 0 < size < len(dataset) or size > len(candidates):
        taught = (f" ({len(dataset) - len(candidates)} of them are SFT items or RL-only rows, extra_info.{IN_SFT} or "
                  f"extra_info.{RL_ONLY}, never held back)") if len(candidates) < len(dataset) else ""
        raise InputError(f"data.dev_size={size}: hold back at least 1 and at most {min(len(candidates), len(dataset) - 1)} "
                         f"of the {len(dataset)} training prompts{taught}")
    held = {candidates[i] for i in np.random.default_rng(seed).permutation(len(candidates))[:size].tolist()}
    return (dataset.with_samples([sample for index, sample in enumerate(dataset.samples) if index not in held]),
            dataset.with_samples([sample for index, sample in enumerate(dataset.samples) if index in held]))


def _fit(ids: list[int], index: int, row: PromptRow, max_length: int, truncation: str) -> list[int]:
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    raise PromptTooLongError(
        f"prompt {index} (row {row.row} of {row.file}) is {len(ids)} tokens after the chat template, "
        f"over max_prompt_length={max_length}. Raise data.max_prompt_length to at least {len(ids)}, drop "
        "such prompts with data.filter_overlong_prompts=true, or cut them with data.truncation=left "
        "(keeps the end, where the question usually is) or data.truncation=right"
    )


def _make_sample(row: PromptRow, prompt_ids: list[int]) -> PromptSample:
    return PromptSample(
        prompt_ids=list(prompt_ids),
        messages=row.messages,
        data_source=row.data_source,
        ground_truth=row.ground_truth,
        extra_info=row.extra_info,
        file=row.file,
        row=row.row,
    )
