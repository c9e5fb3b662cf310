"""Which workers a run needs, where they run, and starting them.

The default single-machine layout colocates every role in one pool: one process per rank holds the
policy (training + rollout), and the reference / critic / reward model when the run uses them. On
CPU each process gets an equal share of the machine's cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import critic_enabled
from posttrain.controller import ResourcePool, ResourcePoolManager, WorkerGroup, WorkerSpec, spawn_pools
from posttrain.workers.critic import CriticWorker
from posttrain.workers.policy import PolicyWorker
from posttrain.workers.reference import ReferenceWorker
from posttrain.workers.reward_model import RewardModelWorker

WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # vLLM in the worker's own process (the hybrid engine)
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    # OpenMP threads that spin while waiting lose badly when other processes share the cores
    # (Ray, the controller, a second worker): measured 1.6x slower vLLM decoding on 2 busy cores.
    "KMP_BLOCKTIME": "0",
    "OMP_WAIT_POLICY": "PASSIVE",
}


@dataclass
class Roles:
    actor: WorkerGroup
    ref: WorkerGroup | None
    critic: WorkerGroup | None
    reward_model: WorkerGroup | None
    pools: ResourcePoolManager

    def release(self) -> None:
        for pool in self.pools.pools.values():
            pool.release()


def uses_reference(config: PosttrainConfig) -> bool:
    return config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def optimizer_steps(config: PosttrainConfig, trainer_steps: int, mini_batch_size: int, epochs: int) -> int:
    """Optimizer steps over a run: one per mini-batch per PPO epoch per trainer step (the LR schedule's unit)."""
    return trainer_steps * epochs * (config.data.train_batch_size // mini_batch_size)


def worker_specs(config: PosttrainConfig, total_steps: int) -> dict[str, WorkerSpec]:
    arr, seed = config.actor_rollout_ref, config.trainer.seed
    actor_steps = optimizer_steps(config, total_steps, arr.actor.ppo_mini_batch_size, arr.actor.ppo_epochs)
    critic_steps = optimizer_steps(config, total_steps, config.critic.ppo_mini_batch_size, config.critic.ppo_epochs)
    specs = {"actor": WorkerSpec(PolicyWorker, (arr.model, arr.actor, arr.rollout, config.data), {"total_steps": actor_steps, "seed": seed})}
    if uses_reference(config):
        specs["ref"] = WorkerSpec(ReferenceWorker, (arr.model, arr.actor, arr.ref, arr.rollout), {"seed": seed})
    if critic_enabled(config):
        specs["critic"] = WorkerSpec(CriticWorker, (arr.model, config.critic), {
            "rollout_n": arr.rollout.n, "loss_agg_mode": arr.actor.loss_agg_mode,
            "max_response_length": config.data.max_response_length, "dtype": arr.actor.dtype,
            "total_steps": critic_steps, "seed": seed,
        })
    if config.reward_model.enable:
        specs["reward_model"] = WorkerSpec(RewardModelWorker, (config.reward_model,))
    return specs


def start_roles(config: PosttrainConfig, total_steps: int) -> Roles:
    trainer = config.trainer
    gpus = 1.0 if _use_gpu(trainer.device) else 0.0
    cpus = trainer.cpus_per_worker or max(1, (os.cpu_count() or 1) // trainer.n_workers_per_node)
    pool = ResourcePool("global_pool", [trainer.n_workers_per_node] * trainer.nnodes, cpus_per_bundle=cpus, gpus_per_bundle=gpus)
    specs = worker_specs(config, total_steps)
    manager = ResourcePoolManager({"global_pool": pool}, {role: "global_pool" for role in specs})
    # Several ranks: the process group exists before the engines are built, so they pick DDP/FSDP.
    groups = spawn_pools(manager, specs, env=WORKER_ENV, distributed=pool.world_size > 1)
    return Roles(groups["actor"], groups.get("ref"), groups.get("critic"), groups.get("reward_model"), manager)


def _use_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available() or device == "cuda"
