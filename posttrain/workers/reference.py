"""The reference worker: a frozen copy of the initial policy, for KL against it."""

from __future__ import annotations

from posttrain import keys
from posttrain.config.schema import ActorConfig, ModelConfig, RefConfig, RolloutConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.models import resolve_model
from posttrain.protocol import Batch
from posttrain.workers.engines import training_engine


class ReferenceWorker(Worker):
    def __init__(
        self, ctx: WorkerContext, model: ModelConfig, actor: ActorConfig, ref: RefConfig, rollout: RolloutConfig, *, seed: int = 0
    ) -> None:
        super().__init__(ctx)
        self.ref, self.temperature = ref, rollout.temperature
        # Same construction as the policy (same seed, so LoRA adapters start identical), never stepped.
        self.engine = training_engine(
            str(resolve_model(model.path)), model, actor.optim, dtype=actor.dtype, grad_clip=actor.grad_clip,
            total_steps=None, metric_prefix="ref", seed=seed, attn_implementation=actor.attn_implementation,
        )

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        logprobs, _ = self.engine.compute_logprobs(
            batch, micro_batch_size=self.ref.log_prob_micro_batch_size_per_gpu, temperature=self.temperature
        )
        return Batch.from_dict({keys.REF_LOGPROBS: logprobs})
