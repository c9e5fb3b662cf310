"""The policy worker: the hybrid engine, training engine and rollout engine in one process.

generate → compute_log_prob → update → sync_weights: the rollout engine samples with the current
weights; the training engine recomputes their logprobs (the "old" policy of PPO) and updates; the
new weights go into the rollout engine in place, with the next version number, never through disk.
On GPU the rollout engine sleeps (frees its KV cache) while the training engine works.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from posttrain import keys
from posttrain.config.schema import ActorConfig, DataConfig, ModelConfig, RolloutConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.models import load_tokenizer, resolve_model
from posttrain.protocol import Batch
from posttrain.workers.engines import generation_params, rollout_engine, training_engine
from posttrain.workers.objectives import PolicyObjective, sft_objective
from posttrain.workers.rollout_batch import generations_to_batch, prompt_token_lists

RANK_SEED_STRIDE = 1_000_003  # ranks' sampling seeds far apart: a rank's requests take base, base+1, ...
VALIDATE_META_KEY = "validate"  # meta flag: sample with rollout.val_kwargs instead of training settings


def mean_metrics(per_step: list[dict[str, float]]) -> dict[str, float]:
    names = {name for metrics in per_step for name in metrics}
    return {name: statistics.fmean(m[name] for m in per_step if name in m) for name in sorted(names)}


class PolicyWorker(Worker):
    def __init__(
        self, ctx: WorkerContext, model: ModelConfig, actor: ActorConfig, rollout: RolloutConfig, data: DataConfig,
        *, total_steps: int | None = None, seed: int = 0,
    ) -> None:
        super().__init__(ctx)
        self.actor, self.rollout_config, self.data = actor, rollout, data
        self.seed = seed
        model_path = str(resolve_model(model.path))
        self.tokenizer = load_tokenizer(model_path)
        self.engine = training_engine(
            model_path, model, actor.optim, dtype=actor.dtype, grad_clip=actor.grad_clip, total_steps=total_steps, seed=seed,
        )
        self.rollout = rollout_engine(
            model_path, rollout, max_model_len=data.max_prompt_length + data.max_response_length, seed=seed + ctx.rank
        )
        self.objective = PolicyObjective.from_config(actor, data.max_response_length)

    # ---- rollout --------------------------------------------------------------------------------

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def generate(self, batch: Batch) -> Batch:
        """Prompts (PROMPT_IDS, PROMPT_MASK) → the same rows with responses and model inputs added."""
        validate = bool(batch.meta.get(VALIDATE_META_KEY, False))
        # Seeded by the weight version (restored with a checkpoint), so a resumed run samples as
        # the uninterrupted one would have.
        params = generation_params(
            self.rollout_config, self.data.max_response_length, validation=validate,
            seed=self.seed + 1000 * self.rollout.version + RANK_SEED_STRIDE * self.rank,
        )
        self.rollout.wake_up()
        generations = self.rollout.generate(prompt_token_lists(batch), params)
        self.rollout.sleep()
        pad = self.tokenizer.pad_token_id
        return generations_to_batch(batch, generations, self.data.max_response_length, pad)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def generate_turn(self, batch: Batch) -> Batch:
        """One agent turn for each row's context (TURN_CONTEXT_IDS): TURN_TOKEN_IDS, TURN_LOGPROBS, FINISH_REASON.

        Meta: TURN_MAX_NEW_TOKENS, TURN_STOP, TURN_INDEX and optionally VALIDATE_META_KEY. The
        tokens come back exactly as sampled; the agent loop appends them without re-tokenising.
        The engine stays awake between turns (its prefix cache holds the contexts); the agent loop
        calls :meth:`release_rollout` when its episodes end.
        """
        validate = bool(batch.meta.get(VALIDATE_META_KEY, False))
        params = replace(
            generation_params(
                self.rollout_config, int(batch.meta[keys.TURN_MAX_NEW_TOKENS]), validation=validate,
                seed=self.seed + 1000 * self.rollout.version + 100_003 * int(batch.meta.get(keys.TURN_INDEX, 0))
                + RANK_SEED_STRIDE * self.rank,
            ),
            stop=tuple(batch.meta.get(keys.TURN_STOP, ())),
        )
        self.rollout.wake_up()
        generations = self.rollout.generate([list(context) for context in batch[keys.TURN_CONTEXT_IDS]], params)
        return Batch.from_dict(
            non_tensors={
                keys.TURN_TOKEN_IDS: [g.response_token_ids for g in generations],
                keys.TURN_LOGPROBS: [g.logprobs for g in generations],
                keys.FINISH_REASON: [g.finish_reason for g in generations],
            },
            meta={keys.WEIGHT_VERSION: self.rollout.version},
        )

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """Let the rollout engine sleep (free its accelerator memory) after a multi-turn rollout."""
        self.rollout.sleep()

    # ---- training -------------------------------------------------------------------------------

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """OLD_LOGPROBS and ENTROPY under the current weights, at the rollout's temperature."""
        logprobs, entropy = self.engine.compute_logprobs(
            batch, micro_batch_size=self.rollout_config.log_prob_micro_batch_size_per_gpu,
            temperature=self.rollout_config.temperature, with_entropy=True,
        )
        return Batch.from_dict({keys.OLD_LOGPROBS: logprobs, keys.ENTROPY: entropy})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def update(self, batch: Batch) -> Batch:
        """PPO epochs over shuffled mini-batches of this rank's share; returns metrics in meta."""
        per_rank = self.actor.ppo_mini_batch_size * self.rollout_config.n // self.world_size
        if keys.OLD_LOGPROBS not in batch and (self.actor.ppo_epochs > 1 or len(batch) > per_rank):
            raise ValueError(
                f"update got no {keys.OLD_LOGPROBS} but makes several optimizer steps ({self.actor.ppo_epochs} epoch(s) over "
                f"{len(batch)} samples in mini-batches of {per_rank}); compute them first (compute_log_prob): only a single "
                "step may use its own forward pass as π_old"
            )
        micro = {"max_tokens": self.actor.ppo_max_token_len_per_gpu} if self.actor.use_dynamic_bsz else {
            "micro_batch_size": self.actor.ppo_micro_batch_size_per_gpu}
        steps = [
            self.engine.train_mini_batch(
                mini_batch, self.objective, loss_agg_mode=self.actor.loss_agg_mode,
                temperature=self.rollout_config.temperature, with_entropy=True, **micro,
            )
            for mini_batch in batch.minibatches(
                min(per_rank, len(batch)), epochs=self.actor.ppo_epochs, shuffle=self.actor.shuffle,
                seed=self.seed + self.engine.global_step,  # optimizer steps so far: restored on resume
            )
        ]
        return Batch().with_metrics(mean_metrics(steps))

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def sft_step(self, batch: Batch) -> Batch:
        """One optimizer step of supervised fine-tuning on this rank's share of transcripts (loss on RESPONSE_MASK)."""
        metrics = self.engine.train_mini_batch(
            batch, sft_objective, micro_batch_size=self.actor.ppo_micro_batch_size_per_gpu, loss_agg_mode="token-mean",
        )
        return Batch().with_metrics(metrics)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def compute_sft_logprobs(self, batch: Batch) -> Batch:
        """LOGPROBS of the response tokens at temperature 1 (the SFT validation loss)."""
        logprobs, _ = self.engine.compute_logprobs(batch, micro_batch_size=self.actor.ppo_micro_batch_size_per_gpu)
        return Batch.from_dict({keys.LOGPROBS: logprobs})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self, version: int) -> int:
        """The training engine's weights into the rollout engine, in place, as ``version``."""
        self.rollout.wake_up()
        self.rollout.load_weights(self.engine.named_weights(), version)
        self.rollout.sleep()
        return self.rollout.version

    # ---- persistence ----------------------------------------------------------------------------

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(Path(directory))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str, version: int) -> None:
        self.engine.load_checkpoint(Path(directory))
        self.sync_weights(version)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def export(self, directory: str) -> str:
        return str(self.engine.export_hf(Path(directory)))
