"""Sampling from a worker's rollout engine: the methods the rollouts call on "the actor".

:class:`Sampling` is mixed into every worker that owns a rollout engine and samples for the policy:
the policy worker (synchronous training: the hybrid engine) and the generator (asynchronous
training). The rollouts (``posttrain/rollout/``) call ``generate`` (one response per prompt row)
or ``generate_turn`` (one agent turn per context) and ``release_rollout``, and do not know which.
Both answer with token lists exactly as sampled; the rollout builds the training Batch from them.

Seeds: a ``generate`` call's sampling seed is ``seed + 1000 × step + RANK_SEED_STRIDE × rank +
row_offset``; the engine gives the i-th row base + i. ``step`` is the weight version in sync mode,
where batch ``b`` is always sampled by version ``b``; a generator sets ``seed_step`` to its unit's
batch instead (versions do not number batches when it runs ahead), and ``row_offset`` to the unit's
first row in the batch, so a batch split over generator calls is seeded exactly as one call over the
whole batch would be; validation, sampled a batch at a time, puts each batch's first row in its
meta (``keys.ROW_OFFSET``) for the same reason. An agent turn's context is seeded by its own request
key (its episode's key and turn, :func:`request_seed`), not by its place in the call: the agent loop and a program's
endpoint, which gather the same requests into different calls, sample alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from posttrain import keys
from posttrain.controller import Dispatch, register
from posttrain.engines.rollout import Generation
from posttrain.protocol import Batch
from posttrain.workers.engines import generation_params

RANK_SEED_STRIDE = 1_000_003  # ranks' sampling seeds far apart: a rank's requests take base, base+1, ...
VALIDATE_META_KEY = "validate"  # meta flag: sample with rollout.val_kwargs instead of training settings


def request_seed(seed: int, step: int, request_key: str, validate: bool = False) -> int:
    """The sampling seed of one agent-turn request: ``trainer.seed``, the step, training or validation, and the
    request's key (``"<episode key>:<turn>"``), hashed to 31 bits."""
    digest = hashlib.sha256(f"{seed}:{step}:{'val' if validate else 'train'}:{request_key}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


@dataclass(frozen=True)
class WeightsAtVersion:
    """Published policy weights (Hugging Face names, CPU tensors) and the version they are."""

    version: int
    weights: dict[str, torch.Tensor]

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.weights.items())


class Sampling:
    """Needs ``self.rollout`` (the engine), ``rollout_config``, ``data``, ``seed``, ``tokenizer``, ``rank``."""

    row_offset: int = 0
    seed_step: int | None = None  # None: the weight version

    @property
    def _step(self) -> int:
        return self.rollout.version if self.seed_step is None else self.seed_step

    def _seed(self, batch: Batch | None = None) -> int:
        offset = self.row_offset + (int(batch.meta.get(keys.ROW_OFFSET, 0)) if batch is not None else 0)
        return self.seed + 1000 * self._step + RANK_SEED_STRIDE * self.rank + offset

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def generate(self, batch: Batch) -> Batch:
        """Prompts (PROMPT_IDS, PROMPT_MASK) → one response per row: TURN_TOKEN_IDS, TURN_LOGPROBS, FINISH_REASON."""
        validate = bool(batch.meta.get(VALIDATE_META_KEY, False))
        # Seeded by the weight version (restored with a checkpoint), so a resumed run samples as
        # the uninterrupted one would have.
        budget = int(batch.meta.get(keys.TURN_MAX_NEW_TOKENS, self.data.max_response_length))  # a mixture's source may set less
        params = generation_params(self.rollout_config, budget, validation=validate, seed=self._seed(batch))
        self.rollout.wake_up()
        ids, mask = batch[keys.PROMPT_IDS], batch[keys.PROMPT_MASK].bool()
        generations = self.rollout.generate([row[row_mask].tolist() for row, row_mask in zip(ids, mask)], params)
        self.rollout.sleep()
        return _sampled(generations, self.rollout.version)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def generate_turn(self, batch: Batch) -> Batch:
        """One agent turn for each row's context (TURN_CONTEXT_IDS, seeded by its TURN_REQUEST_KEYS):
        TURN_TOKEN_IDS, TURN_LOGPROBS, FINISH_REASON.

        Meta: TURN_MAX_NEW_TOKENS, TURN_STOP and optionally VALIDATE_META_KEY. The
        tokens come back exactly as sampled; the agent loop appends them without re-tokenising.
        The engine stays awake between turns (its prefix cache holds the contexts); the agent loop
        calls :meth:`release_rollout` when its episodes end.
        """
        validate = bool(batch.meta.get(VALIDATE_META_KEY, False))
        params = replace(
            generation_params(
                self.rollout_config, int(batch.meta[keys.TURN_MAX_NEW_TOKENS]), validation=validate, seed=None,
            ),
            stop=tuple(batch.meta.get(keys.TURN_STOP, ())),
        )
        seeds = [request_seed(self.seed, self._step, str(key), validate) for key in batch[keys.TURN_REQUEST_KEYS]]
        self.rollout.wake_up()
        generations = self.rollout.generate([list(context) for context in batch[keys.TURN_CONTEXT_IDS]], params, seeds)
        return _sampled(generations, self.rollout.version)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """Let the rollout engine sleep (free its accelerator memory) after a multi-turn rollout."""
        self.rollout.sleep()


def _sampled(generations: list[Generation], version: int) -> Batch:
    """The engine's generations as a Batch of token lists (no padding: the rollout builds the training Batch)."""
    return Batch.from_dict(
        non_tensors={
            keys.TURN_TOKEN_IDS: [g.response_token_ids for g in generations],
            keys.TURN_LOGPROBS: [g.logprobs for g in generations],
            keys.FINISH_REASON: [g.finish_reason for g in generations],
        },
        meta={keys.WEIGHT_VERSION: version},
    )
