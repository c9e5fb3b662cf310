"""The policy worker: the hybrid engine, training engine and rollout engine in one process.

generate → compute_log_prob → update → sync_weights: the rollout engine samples with the current
weights; the training engine recomputes their logprobs (the "old" policy of PPO) and updates; the
new weights go into the rollout engine in place, with the next version number, never through disk.
On GPU the rollout engine sleeps (frees its KV cache) while the training engine works.
"""

from __future__ import annotations

from pathlib import Path

from posttrain import keys
from posttrain.config.schema import ActorConfig, DataConfig, ModelConfig, RolloutConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.controller.worker import free_port, node_address
from posttrain.models import load_tokenizer, resolve_model
from posttrain.metrics import merge
from posttrain.protocol import Batch, mini_batch_count
from posttrain.workers.engines import rollout_engine, training_engine
from posttrain.workers.objectives import PolicyObjective, sft_objective
from posttrain.workers.sampling import VALIDATE_META_KEY, Sampling, WeightsAtVersion
from posttrain.workers.weight_broadcast import WeightBroadcast

__all__ = ["VALIDATE_META_KEY", "PolicyWorker"]


class PolicyWorker(Sampling, Worker):
    """``generate``, ``generate_turn`` and ``release_rollout`` come from :class:`Sampling`."""

    def __init__(
        self, ctx: WorkerContext, model: ModelConfig, actor: ActorConfig, rollout: RolloutConfig, data: DataConfig,
        *, total_steps: int | None = None, seed: int = 0, importance_cap: float | None = None,
    ) -> None:
        super().__init__(ctx)
        self.actor, self.rollout_config, self.data = actor, rollout, data
        self.seed = seed
        model_path = str(resolve_model(model.path))
        self.tokenizer = load_tokenizer(model_path)
        self.engine = training_engine(
            model_path, model, actor.optim, dtype=actor.dtype, grad_clip=actor.grad_clip, total_steps=total_steps, seed=seed,
            attn_implementation=actor.attn_implementation, compile=actor.compile,
        )
        self.rollout = rollout_engine(
            model_path, rollout, max_model_len=data.max_prompt_length + data.max_response_length, seed=seed + ctx.rank
        )
        self.objective = PolicyObjective.from_config(actor, data.max_response_length, importance_cap)
        self.weight_group: WeightBroadcast | None = None  # rank 0's, with the generators (async.weight_transport=collective)

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
        count = mini_batch_count(batch, self.actor.ppo_mini_batch_size)
        if keys.OLD_LOGPROBS not in batch and (self.actor.ppo_epochs > 1 or (count or len(batch) // per_rank) > 1):
            raise ValueError(
                f"update got no {keys.OLD_LOGPROBS} but makes several optimizer steps ({self.actor.ppo_epochs} epoch(s) over "
                f"{len(batch)} samples in mini-batches of {per_rank}); compute them first (compute_log_prob): only a single "
                "step may use its own forward pass as π_old"
            )
        micro = {"max_tokens": self.actor.ppo_max_token_len_per_gpu} if self.actor.use_dynamic_bsz else {
            "micro_batch_size": self.actor.ppo_micro_batch_size_per_gpu}
        steps = []
        for mini_batch in batch.minibatches(
            min(per_rank, len(batch)), epochs=self.actor.ppo_epochs, shuffle=self.actor.shuffle,
            seed=self.seed + self.engine.global_step,  # optimizer steps so far: restored on resume
            group_ids=batch[keys.GROUP_IDS] if keys.GROUP_IDS in batch else None, count=count,
        ):
            skip = self.objective.rows_without_gradient(mini_batch) if self.actor.skip_zero_advantage else None
            steps.append(self.engine.train_mini_batch(
                mini_batch, self.objective, loss_agg_mode=self.actor.loss_agg_mode,
                temperature=self.rollout_config.temperature, with_entropy=True, skip_rows=skip, **micro,
            ))
        return Batch().with_metrics(merge(steps))

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

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def publish_weights(self, version: int) -> list | None:
        """The training weights as ONE object in Ray's object store, for generators to pull:
        rank 0 returns ``[ref]`` (a list, so the reference itself travels), the other ranks None.
        Every rank takes part: sharded weights are gathered collectively."""
        import ray

        # ray.put copies into the object store at once, so CPU tensors go in as they are (no copy of our own)
        weights = {name: tensor.detach().to("cpu") for name, tensor in self.engine.named_weights()}
        return [ray.put(WeightsAtVersion(version, weights))] if self.rank == 0 else None

    @register(dispatch=Dispatch.RANK_ZERO)
    def weight_group_address(self) -> tuple[str, int]:
        """Where the weight-broadcast group's store will listen (this node, a free port)."""
        return node_address(), free_port()

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Rank 0 becomes rank 0 of the weight-broadcast group with the generators (collective: they join too)."""
        if self.rank == 0:
            if self.weight_group is not None:
                self.weight_group.close()  # the group of the generators before one was replaced
            self.weight_group = WeightBroadcast(host, port, 0, world_size, self.engine.device)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def broadcast_weights(self, version: int) -> None:
        """The training weights to every generator of the weight group, as ``version``."""
        weights = self.engine.named_weights()  # every rank iterates: sharded weights are gathered collectively
        if self.rank == 0:
            self.weight_group.send(version, weights)
        else:
            for _ in weights:
                pass

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
