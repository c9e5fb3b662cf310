"""Which workers a run needs, where they run, and starting them.

The default single-machine layout colocates every role in one pool: one process per rank holds the
policy (training + rollout), and the reference / critic / reward model when the run uses them. On
CPU each process gets an equal share of the machine's cores.

The Env-LLM (the environment's model, e.g. a patient) is built FIRST, so that on a GPU its memory is
reserved before the policy's engines take theirs: colocated (``env.llm.placement=colocate``, the
default) it is the first worker of each policy process; ``separate`` gives it a pool of its own
(``env.llm.cpus`` CPUs, ``env.llm.gpus`` GPUs on a GPU machine), taken out of the machine before the
policy's share is computed. A mode may add pools of its own (:class:`ModeWorkers`: an asynchronous
run's generators get a one-process pool each, ``trainer/async_/coordinator.py``), also taken out
first: every pool is in the one :class:`~posttrain.controller.ResourcePoolManager`, which checks the
cluster can hold them all before any worker starts. What a mode adds is passed in, never looked up
from ``trainer.mode``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.config.schema import PosttrainConfig
from posttrain.config.algorithm_checks import critic_enabled
from posttrain.controller import ResourcePool, ResourcePoolManager, WorkerGroup, WorkerSpec, kill_group, spawn_pools
from posttrain.controller.memory import MEMORY_METRIC
from posttrain.metrics import Metrics, maximum, merge
from posttrain.rollout.env_llm import needs_env_llm_worker
from posttrain.rollout.roles import RolloutRoles
from posttrain.workers.critic import CriticWorker
from posttrain.workers.env_llm import EnvLLMWorker
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


@dataclass(frozen=True)
class SidePool:
    """A one-process pool a mode adds beside the trainer's (an asynchronous run's generator), taken out
    of this machine before the trainer's share; the mode starts its workers."""

    name: str
    cpus: float
    gpus: float    # on a GPU machine; none on CPU
    sized_by: str  # the settings that size it, for messages


@dataclass(frozen=True)
class ModeWorkers:
    """What a mode adds to the workers every run starts (nothing, for sync and SFT)."""

    importance_cap: float | None = None   # the actor's correction for samples of older weights (async's decoupled PPO)
    side_pools: tuple[SidePool, ...] = ()


@dataclass
class Roles:
    actor: WorkerGroup
    ref: WorkerGroup | None
    critic: WorkerGroup | None
    reward_model: WorkerGroup | None
    pools: ResourcePoolManager
    env_llm: WorkerGroup | None = None

    def for_rollout(self) -> RolloutRoles:
        """The workers a rollout calls."""
        return RolloutRoles(self.actor, self.reward_model, self.env_llm)

    def resident_memory(self) -> Metrics:
        """``memory/<group>/rss_gb`` (and ``peak_rss_gb``, the high-water mark; ``heap_used_gb`` and ``heap_free_gb``,
        glibc's heaps) for each pool's processes, asked once per process (colocated roles
        share it): ``policy`` for the trainer's pool, the role's name for a pool of its own (a separate
        Env-LLM); the largest rank's, as a maximum. A mode's side pools report their own (generators:
        in each unit's metrics)."""
        groups = {"actor": self.actor, "ref": self.ref, "critic": self.critic, "reward_model": self.reward_model, "env_llm": self.env_llm}
        pieces = []
        for roles in self.pools.roles_by_pool().values():
            role = "actor" if "actor" in roles else next((r for r in roles if groups.get(r) is not None), None)
            if role is not None:
                group = "policy" if role == "actor" else role
                pieces += [{MEMORY_METRIC.format(group=group, name=name): maximum(gb) for name, gb in rank.items()}
                           for rank in groups[role].process_memory_gb()]
        return merge(pieces)

    def release(self) -> None:
        """Stop every worker process (a stuck one too), then free the pools."""
        for group in (self.actor, self.ref, self.critic, self.reward_model, self.env_llm):
            if group is not None:
                kill_group(group)
        for pool in self.pools.pools.values():
            pool.release()


def uses_reference(config: PosttrainConfig) -> bool:
    return config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def optimizer_steps(config: PosttrainConfig, trainer_steps: int, mini_batch_size: int, epochs: int, warmup_steps: int) -> int:
    """Optimizer steps over a run: one per mini-batch per PPO epoch per trainer step (the LR schedule's
    unit). An evaluation (0 trainer steps) builds an optimizer it never steps: the shortest schedule
    its settings accept."""
    if trainer_steps == 0:
        return max(1, warmup_steps)
    return trainer_steps * epochs * (config.data.train_batch_size // mini_batch_size)


def worker_specs(config: PosttrainConfig, total_steps: int, mode: ModeWorkers = ModeWorkers()) -> dict[str, WorkerSpec]:
    arr, seed = config.actor_rollout_ref, config.trainer.seed
    actor_steps = optimizer_steps(config, total_steps, arr.actor.ppo_mini_batch_size, arr.actor.ppo_epochs, arr.actor.optim.warmup_steps)
    critic_steps = optimizer_steps(config, total_steps, config.critic.ppo_mini_batch_size, config.critic.ppo_epochs, config.critic.optim.warmup_steps)
    specs = {"env_llm": WorkerSpec(EnvLLMWorker, (config.env.llm,), {"seed": seed})} if needs_env_llm_worker(config) else {}
    specs["actor"] = WorkerSpec(PolicyWorker, (arr.model, arr.actor, arr.rollout, config.data), {
        "total_steps": actor_steps, "seed": seed, "importance_cap": mode.importance_cap,
    })
    if uses_reference(config):
        specs["ref"] = WorkerSpec(ReferenceWorker, (arr.model, arr.actor, arr.ref, arr.rollout), {"seed": seed})
    if critic_enabled(config):
        specs["critic"] = WorkerSpec(CriticWorker, (arr.model, config.critic), {
            "rollout_n": arr.rollout.n, "loss_agg_mode": arr.actor.loss_agg_mode,
            "max_response_length": config.data.max_response_length, "dtype": arr.actor.dtype,
            "total_steps": critic_steps, "seed": seed, "attn_implementation": arr.actor.attn_implementation,
        })
    if config.reward_model.enable:
        specs["reward_model"] = WorkerSpec(RewardModelWorker, (config.reward_model,))
    return specs


def resource_pools(config: PosttrainConfig, roles: list[str], side_pools: Sequence[SidePool] = ()) -> ResourcePoolManager:
    """The pools and the role → pool mapping (roles in build order: the Env-LLM first; a mode's side
    pools, each its own role, last: the mode starts their workers, not here). The one place that sizes
    each process: what the Env-LLM (placed apart) and the side pools take comes out of this machine
    first, the trainer's ranks share the rest."""
    trainer, llm = config.trainer, config.env.llm
    gpus = 1.0 if uses_gpu(trainer.device) else 0.0
    separate = "env_llm" in roles and llm.placement == "separate"
    cpus = trainer_cpus_per_worker(config, llm.cpus if separate else 0, side_pools)
    pools = {"global_pool": ResourcePool("global_pool", [trainer.n_workers_per_node] * trainer.nnodes, cpus_per_bundle=cpus,
                                         gpus_per_bundle=gpus, sized_by=f"the trainer (trainer.nnodes={trainer.nnodes} × "
                                         f"trainer.n_workers_per_node={trainer.n_workers_per_node})")}
    mapping = {role: "global_pool" for role in roles}
    if separate:
        pools["env_llm_pool"] = ResourcePool("env_llm_pool", [1], cpus_per_bundle=llm.cpus, gpus_per_bundle=llm.gpus if gpus else 0.0,
                                             sized_by=f"the Env-LLM (env.llm.cpus={llm.cpus:g})")
        mapping["env_llm"] = "env_llm_pool"
    for side in side_pools:
        pools[side.name] = ResourcePool(side.name, [1], cpus_per_bundle=side.cpus, gpus_per_bundle=side.gpus if gpus else 0.0,
                                        sized_by=side.sized_by)
        mapping[side.name] = side.name
    return ResourcePoolManager(pools, mapping)


def trainer_cpus_per_worker(config: PosttrainConfig, reserved: float = 0, side_pools: Sequence[SidePool] = ()) -> float:
    """Each trainer process's CPUs: ``trainer.cpus_per_worker``, or an equal share of what this machine
    has left after ``reserved`` and a mode's side pools. Whole CPUs, except that a side pool's fraction
    (``async.generator_cpus=0.5``: a generator mostly waits on environments) is left to a single trainer
    process, whose threads round up: the two then share a core."""
    if config.trainer.cpus_per_worker:
        return config.trainer.cpus_per_worker
    free = (os.cpu_count() or 1) - reserved - sum(side.cpus for side in side_pools)
    workers = config.trainer.n_workers_per_node
    return max(1, free if workers == 1 else free // workers)


def start_roles(config: PosttrainConfig, total_steps: int, mode: ModeWorkers = ModeWorkers()) -> Roles:
    """The run's workers (and the pools of ``mode``'s side pools, whose workers the mode starts)."""
    specs = worker_specs(config, total_steps, mode)
    manager = resource_pools(config, list(specs), mode.side_pools)
    # Several ranks: the process group exists before the engines are built, so they pick DDP/FSDP.
    distributed = manager.pools["global_pool"].world_size > 1
    groups = spawn_pools(manager, specs, env=WORKER_ENV, distributed=distributed, call_timeout_s=config.trainer.call_timeout_s)
    return Roles(groups["actor"], groups.get("ref"), groups.get("critic"), groups.get("reward_model"), manager, groups.get("env_llm"))


def uses_gpu(device: str) -> bool:
    """Whether processes of a run on ``trainer.device`` get a GPU each (auto: when this machine has one)."""
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available() or device == "cuda"
