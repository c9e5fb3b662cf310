"""Batches of prompts as :class:`~posttrain.protocol.Batch`, with a position that checkpoints save.

:class:`EpochSampler` decides which prompts form each batch. Its whole state is ``(epoch, index)``:
the epoch number and how many prompts of that epoch's order are already handed out. The order of an
epoch is a permutation drawn from ``(seed, epoch)`` alone, so a run resumed from a saved state
continues with exactly the batches the uninterrupted run would have produced. The state is advanced
*before* a batch is handed out, so a ``state_dict()`` taken while a batch is being trained on
already counts it, and one taken after the last batch of an epoch points at the next epoch's start.

Iterating a :class:`PromptDataLoader` yields the rest of the current epoch; the trainer's loop is::

    while loader.epoch < total_epochs:
        for batch in loader:
            ...

Each batch holds (see :mod:`posttrain.keys`)

  tensors      PROMPT_IDS (B, P) int64, left-padded with the pad token to the batch's longest prompt;
               PROMPT_MASK (B, P) int64, 1 on real prompt tokens
  non-tensors  RAW_PROMPT (chat messages), DATA_SOURCE, GROUND_TRUTH, EXTRA_INFO, and UID (per prompt,
               shared later by its rollout.n responses: ``"<epoch>:<dataset row>"`` from the loader,
               a uuid4 string from :func:`collate_prompts` alone)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from posttrain import keys
from posttrain.data.dataset import PromptSample
from posttrain.errors import InputError
from posttrain.protocol import Batch, pad_rows

# (B, P) int64, 1 on real prompt tokens. keys.ATTENTION_MASK is (B, L) over prompt+response, and a
# prompt-only mask under the same name would clash when the rollout's columns are joined in.


class EpochSampler:
    """Batches of dataset indices, epoch after epoch, resumable from ``(epoch, index)``."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = True) -> None:
        if batch_size < 1:
            raise InputError(f"batch size must be at least 1, got {batch_size}")
        if drop_last and num_samples < batch_size:
            raise InputError(
                f"the dataset has {num_samples} prompts, fewer than one batch of {batch_size}; "
                "lower data.train_batch_size or add prompts"
            )
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self._epoch, self._index = 0, 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of sample indices used in ``epoch`` (identity without shuffle)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        # Seeding from the pair keeps (seed, epoch) orders independent; seed + epoch would repeat them.
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __iter__(self) -> Iterator[np.ndarray]:
        """Index arrays for the rest of the current epoch."""
        epoch = self._epoch
        order = self.order(epoch)
        while self._epoch == epoch and self._has_batch():
            start = self._index
            stop = min(start + self.batch_size, self.num_samples)
            self._index = stop
            if not self._has_batch():
                self._epoch, self._index = epoch + 1, 0
            yield order[start:stop]

    def _has_batch(self) -> bool:
        left = self.num_samples - self._index
        return left >= self.batch_size or (left > 0 and not self.drop_last)

    def rows_drawn(self) -> dict[str, tuple[int, int]]:
        """``{"all": (rows handed out at least once so far, rows)}``: an epoch's rows past its last full batch
        (``drop_last``) wait for a later epoch's order."""
        if self._epoch == 0:
            return {"all": (self._index, self.num_samples)}
        full = len(self) * self.batch_size if self.drop_last else self.num_samples
        never = set(self.order(0)[full:].tolist())
        for epoch in range(1, self._epoch if self.shuffle else 1):  # without shuffle every epoch leaves out the same rows
            if not never:
                break
            never &= set(self.order(epoch)[full:].tolist())
        if never and self._index:  # the few rows left out so far, looked up in this epoch's part (no set of it)
            left = np.fromiter(never, dtype=np.int64)
            never = set(left[~np.isin(left, self.order(self._epoch)[:self._index])].tolist())
        return {"all": (self.num_samples - len(never), self.num_samples)}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "index": self._index, "num_samples": self.num_samples, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; a position with no batch left moves to the next epoch."""
        if state.get("kind", "shuffled") != "shuffled":
            raise InputError(f"the checkpoint's data position was drawn by data.sampler ({state['kind']}), which this run does not "
                             "set; resuming would replay different prompts. Use the same data.sampler, or start fresh "
                             "(trainer.resume_mode=disable)")
        if state.get("num_samples", self.num_samples) != self.num_samples or state.get("seed", self.seed) != self.seed:
            raise InputError(
                f"the checkpoint's data position is for {state.get('num_samples')} prompts shuffled with seed "
                f"{state.get('seed')}, but this dataset has {self.num_samples} prompts and seed {self.seed}; "
                "resuming would replay different prompts. Use the same data files and data.seed, or start "
                "fresh (trainer.resume_mode=disable)"
            )
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index <= self.num_samples:
            raise InputError(f"invalid data position epoch={epoch}, index={index} for {self.num_samples} prompts")
        self._epoch, self._index = epoch, index
        if not self._has_batch():
            self._epoch, self._index = epoch + 1, 0


class PromptDataLoader:
    """Batches of a :class:`RLDataset` as :class:`Batch` (see the module docstring for the keys).

    ``collate(samples, pad_token_id) -> Batch`` makes a batch of another dataset's samples (SFT
    transcripts); the sampling and the resumable position are the same.
    """

    def __init__(
        self,
        dataset: Sequence[Any],
        batch_size: int,
        pad_token_id: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate: Callable[[list[Any], int], Batch] | None = None,
        sampler: Any = None,
    ) -> None:
        """``sampler``: what draws each batch's rows in place of an :class:`EpochSampler` (a
        :class:`~posttrain.data.sampler.StratifiedSampler`, with the same interface)."""
        if pad_token_id is None:
            raise ValueError("pad_token_id is None; load the tokenizer with posttrain.models.load_tokenizer, which sets one")
        self.dataset = dataset
        self.pad_token_id = pad_token_id
        self.collate = collate or collate_prompts
        self.sampler = sampler or EpochSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.sampler.epoch  # one pass of the sampler stays in one epoch
        for indices in self.sampler:
            batch = self.collate([self.dataset[int(i)] for i in indices], self.pad_token_id)
            if keys.UID in batch.non_tensors:  # which prompt of which epoch: what trained_prompts.jsonl records
                drawn = getattr(self.sampler, "draw_tag", lambda: epoch)()  # a sampler that repeats rows in an epoch: its draw
                batch.non_tensors[keys.UID] = [prompt_uid(drawn, int(i)) for i in indices]
            yield batch

    def rows_drawn(self) -> dict[str, tuple[int, int]]:
        """Per stratum (``"all"`` without strata): (rows drawn at least once so far, rows); the sampler's."""
        return self.sampler.rows_drawn()

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def prompt_uid(epoch: int | str, row: int) -> str:
    """A prompt's id in a run: its dataset row and the epoch that read it (``"1:17"``; a stratified
    sampler's, which may draw a row twice in an epoch, the epoch and batch: ``"1.40:17"``)."""
    return f"{epoch}:{row}"


def row_of_uid(uid: str) -> int:
    """The dataset row of a :func:`prompt_uid`."""
    return int(str(uid).rsplit(":", 1)[1])


def collate_prompts(samples: list[PromptSample], pad_token_id: int) -> Batch:
    """One Batch from ``samples``: prompts left-padded to the longest, plus the non-tensor columns."""
    width = max(len(s.prompt_ids) for s in samples)
    prompt_ids = pad_rows([s.prompt_ids for s in samples], width, pad_token_id, left=True)
    prompt_mask = pad_rows([[1] * len(s.prompt_ids) for s in samples], width, left=True)
    # a mixture's rows say their source (its rollout sends each to its own); rows of no mixture have no such column
    sources = {keys.SOURCE: [s.source for s in samples]} if any(s.source for s in samples) else {}
    return Batch.from_dict(
        tensors={keys.PROMPT_IDS: prompt_ids, keys.PROMPT_MASK: prompt_mask},
        non_tensors={
            keys.RAW_PROMPT: [s.messages for s in samples],
            keys.DATA_SOURCE: [s.data_source for s in samples],
            keys.GROUND_TRUTH: [s.ground_truth for s in samples],
            keys.EXTRA_INFO: [s.extra_info for s in samples],
            keys.UID: [str(uuid.uuid4()) for _ in samples],
        } | sources,
    )
