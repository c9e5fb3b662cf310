"""The critic worker: a value model (the policy's backbone with a scalar head), for GAE."""

from __future__ import annotations

from pathlib import Path

from posttrain import keys
from posttrain.config.schema import CriticConfig, ModelConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.models import resolve_model
from posttrain.metrics import merge
from posttrain.protocol import Batch, mini_batch_count
from posttrain.workers.engines import training_engine
from posttrain.workers.objectives import ValueObjective


class CriticWorker(Worker):
    def __init__(
        self, ctx: WorkerContext, model: ModelConfig, critic: CriticConfig, *, rollout_n: int, loss_agg_mode: str,
        max_response_length: int, dtype: str, total_steps: int | None = None, seed: int = 0, attn_implementation: str = "auto",
    ) -> None:
        super().__init__(ctx)
        self.critic, self.rollout_n, self.seed = critic, rollout_n, seed
        self.engine = training_engine(
            str(resolve_model(critic.model_path or model.path)), model, critic.optim, dtype=dtype,
            grad_clip=critic.grad_clip, total_steps=total_steps, value_head=True, metric_prefix="critic", seed=seed,
            attn_implementation=attn_implementation,  # the actor's: the same episodes, the same memory (sdpa keeps no L x L matrices)
        )
        self.objective = ValueObjective.from_config(critic, loss_agg_mode, max_response_length)
        self.loss_agg_mode = loss_agg_mode

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def compute_values(self, batch: Batch) -> Batch:
        values = self.engine.compute_values(batch, micro_batch_size=self.critic.ppo_micro_batch_size_per_gpu)
        return Batch.from_dict({keys.VALUES: values})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def update(self, batch: Batch) -> Batch:
        per_rank = self.critic.ppo_mini_batch_size * self.rollout_n // self.world_size
        steps = [
            self.engine.train_mini_batch(
                mini_batch, self.objective, micro_batch_size=self.critic.ppo_micro_batch_size_per_gpu,
                loss_agg_mode=self.loss_agg_mode,
            )
            for mini_batch in batch.minibatches(
                min(per_rank, len(batch)), epochs=self.critic.ppo_epochs, seed=self.seed + self.engine.global_step,
                group_ids=batch[keys.GROUP_IDS] if keys.GROUP_IDS in batch else None,
                count=mini_batch_count(batch, self.critic.ppo_mini_batch_size),
            )
        ]
        return Batch().with_metrics(merge(steps))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(Path(directory))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_checkpoint(Path(directory))
