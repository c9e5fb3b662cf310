"""Worker groups: every ``@register``-ed worker method, callable from the controller.

A :class:`WorkerGroup` is one role across its ranks. Its ranks live in :class:`WorkerHost` s — one per
process — and a host holds one worker object per role colocated there, each of its own class. The
group binds every registered method of its class onto itself, so ``actor.generate(batch)`` on the
controller dispatches the batch, runs ``generate`` on the ranks and collects the result.

Two backends run the same hosts: Ray actors placed in a :class:`ResourcePool`, or local mode, where
the hosts are plain objects in the controller's process (breakpoints work; tests need no cluster).

On Ray nothing the controller waits for can hang it. Each new process must answer within
``start_timeout_s`` (:class:`WorkerStartError`: Ray could not launch it, e.g. its Python cannot
import Ray); each call's results are gathered within ``call_timeout_s`` (:class:`WorkerHungError`,
naming the role, the ranks still busy and the method; ``None``: no deadline); a rank whose process
is gone fails the call within about a second (:class:`WorkerDiedError`), without waiting for its
peers. The three errors name each rank's process id and the log file its stderr goes to.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.controller import faults
from posttrain.controller.decorator import REGISTER_ATTR, Dispatch, Execute, registered_methods
from posttrain.controller.dispatch import GroupFuture, own_batches, plan_call
from posttrain.controller.memory import limit_heap_growth
from posttrain.controller.resource_pool import ResourcePool
from posttrain.controller.worker import Worker, WorkerContext, free_port, init_process_group, node_address
from posttrain.errors import PosttrainError, ProcessLost
from posttrain.protocol import Batch

DEATH_POLL_S = 1.0
START_TIMEOUT_S = 300.0  # a new process imports torch (and vLLM) before it answers: a minute on a busy small machine


class WorkerDiedError(ProcessLost):
    """A worker process is gone; the message names the role, the rank and the process's log."""


class WorkerHungError(ProcessLost):
    """A worker is alive but has not answered a call within the deadline; the message names the role,
    the ranks still busy, the method and the deadline."""

    def __init__(self, message: str, role: str = "", ranks: Sequence[int] = (), method: str = "") -> None:
        super().__init__(message)
        self.role, self.ranks, self.method = role, list(ranks), method

    def __reduce__(self):  # rebuilt whole on the other side of a process boundary (an async generator's call)
        return type(self), (str(self), self.role, self.ranks, self.method)


class WorkerStartError(PosttrainError):
    """Ray did not start a worker process in time (it cannot launch one, or the resources never come):
    something to fix before the run can start."""

    exit_code = 2


@dataclass(frozen=True)
class WorkerProcess:
    """Where one rank runs: its process id, its node, and the file its stderr goes to (Ray's log)."""

    pid: int
    node: str
    stderr: str | None

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.node}, stderr in {self.stderr or 'the worker logs of that node'}"


@dataclass(frozen=True)
class WorkerSpec:
    """A worker class and the arguments it is constructed with after its :class:`WorkerContext`."""

    cls: type[Worker]
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


class WorkerHost:
    """One process's workers, one per colocated role. Runs as a Ray actor or in-process."""

    def __init__(self, specs: Mapping[str, WorkerSpec]) -> None:
        self.specs = dict(specs)
        self.workers: dict[str, Worker] = {}

    def rendezvous(self) -> tuple[str, int]:
        return node_address(), free_port()

    def build(self, ctx: WorkerContext, set_threads: bool, distributed: bool = False) -> None:
        """Construct this process's workers; with ``distributed``, join the process group first so
        that workers (a training engine choosing DDP or FSDP) see their group when they are built.
        ``set_threads``: the process is the workers' own (a Ray actor), so its threads and its malloc
        are set for them (local mode leaves the caller's process as it is)."""
        if set_threads:
            # Two processes that each use every core thrash a small machine: size the pool by
            # the CPUs this process was given.
            import torch

            threads = max(1, math.ceil(ctx.num_cpus))  # a fractional share rounds up: it shares a core
            torch.set_num_threads(threads)
            os.environ["OMP_NUM_THREADS"] = str(threads)
            limit_heap_growth()  # before the engines allocate: glibc otherwise keeps GBs that PyTorch frees
        if distributed:
            init_process_group(ctx)
        self.workers = {role: spec.cls(ctx, *spec.args, **dict(spec.kwargs)) for role, spec in self.specs.items()}

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        faults.on_call(role, method)  # an injected kill (tests, bench/chaos.py); nothing without POSTTRAIN_KILL_AT
        bound = getattr(self.workers[role], method)
        registration = getattr(bound, REGISTER_ATTR, None)
        if registration is None or not registration.borrow_inputs:
            args, kwargs = own_batches(args), own_batches(kwargs)
        return bound(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    def process(self) -> WorkerProcess:
        try:
            stderr = os.readlink("/proc/self/fd/2")  # Ray points each worker's stderr at its own log file
        except OSError:
            stderr = ""
        return WorkerProcess(os.getpid(), node_address(), stderr if os.path.isfile(stderr) else None)


class _LocalBackend:
    """Runs calls at once in this process; a 'ref' is the finished value (or the raised error)."""

    def __init__(self, hosts: list[WorkerHost]) -> None:
        self.hosts = hosts

    def call(self, rank: int, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        # Copies, as a trip through Ray would make: a worker writing to its input must not
        # change the controller's Batch in local mode either.
        args = tuple(a.copy() if isinstance(a, Batch) else a for a in args)
        kwargs = {k: v.copy() if isinstance(v, Batch) else v for k, v in kwargs.items()}
        return self.hosts[rank].call(role, method, *args, **kwargs)

    def fetch(self, refs: list[Any], ranks: list[int], role: str, method: str) -> list[Any]:
        return list(refs)


class _RayBackend:
    def __init__(self, actors: list[Any], call_timeout_s: float | None = None) -> None:
        self.actors = actors
        self.call_timeout_s = call_timeout_s
        self.processes: list[WorkerProcess | None] = [None] * len(actors)

    def start(self, role: str, timeout_s: float) -> None:
        """Wait until every process answers (learning where it runs and logs), at most ``timeout_s``."""
        import ray

        refs = [actor.process.remote() for actor in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            missing = [rank for rank, ref in enumerate(refs) if ref not in ready]
            for actor in self.actors:
                ray.kill(actor)  # or Ray keeps trying to launch them
            raise WorkerStartError(
                f"worker {role!r} rank(s) {missing}: Ray did not start the process within {timeout_s:g} s. Ray's "
                f"raylet.err and worker-*.err in {_ray_logs_dir()} say why (a Python that cannot import ray or "
                "posttrain: PYTHONPATH/runtime_env; a node without the resources asked for)."
            )
        self.processes = self.fetch(refs, list(range(len(refs))), role, "start")

    def call(self, rank: int, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        # Arguments go top-level so Ray resolves ObjectRefs from earlier calls on the worker side.
        # A Batch is put first: ray.put writes its buffers to the object store once, where an
        # inline argument goes through a slower serialise-then-copy path (3x here).
        args = tuple(_put_batch(a) for a in args)
        kwargs = {k: _put_batch(v) for k, v in kwargs.items()}
        return self.actors[rank].call.remote(role, method, *args, **kwargs)

    def fetch(self, refs: list[Any], ranks: list[int], role: str, method: str) -> list[Any]:
        """Wait for all refs, failing as soon as any rank's process has died (no hang on its peers),
        or once ``call_timeout_s`` has passed with a rank still busy."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        deadline = None if self.call_timeout_s is None else time.monotonic() + self.call_timeout_s
        pending = dict(zip(refs, range(len(refs))))
        values: list[Any] = [None] * len(refs)
        while pending:
            left = DEATH_POLL_S if deadline is None else max(0.0, min(DEATH_POLL_S, deadline - time.monotonic()))
            done, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            for ref in done:
                position = pending.pop(ref)
                try:
                    values[position] = ray.get(ref)
                except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
                    rank = ranks[position]
                    raise WorkerDiedError(
                        f"worker {role!r} rank {rank} died during {method}() (its process is gone: {type(err).__name__}; "
                        f"out of memory? killed?): {self._where(rank)}. The group must be re-created."
                    ) from err
            if not done and deadline is not None and time.monotonic() >= deadline:
                busy = sorted(ranks[position] for position in pending.values())
                where = "; ".join(f"rank {rank}: {self._where(rank)}" for rank in busy)
                raise WorkerHungError(
                    f"worker {role!r} rank(s) {busy} did not answer {method}() within {self.call_timeout_s:g} s and "
                    f"still run it: stuck (a deadlock? a peer gone from a collective?) or slower than the deadline "
                    f"(raise trainer.call_timeout_s). {where}", role, busy, method,
                )
        return values

    def _where(self, rank: int) -> str:
        process = self.processes[rank] if rank < len(self.processes) else None
        return str(process) if process else f"its log is in {_ray_logs_dir()}"


def _ray_logs_dir() -> str:
    """This Ray session's log directory (every worker's stdout and stderr, the raylet's log)."""
    try:
        import ray._private.worker as ray_worker

        return ray_worker._global_node.get_logs_dir_path()
    except (ImportError, AttributeError):  # a Ray without that internal: its documented default
        return "/tmp/ray/session_latest/logs"


def _put_batch(value: Any) -> Any:
    import ray

    return ray.put(value) if isinstance(value, Batch) else value


class WorkerGroup:
    """One role on ``world_size`` ranks; registered methods of ``cls`` become methods of the group."""

    def __init__(self, role: str, cls: type[Worker], backend: _LocalBackend | _RayBackend, world_size: int) -> None:
        self.role = role
        self.cls = cls
        self.world_size = world_size
        self._backend = backend
        self._mesh: list[Any] | None = None
        for name, registration in registered_methods(cls).items():
            if hasattr(type(self), name):
                raise TypeError(f"{cls.__name__}.{name} clashes with WorkerGroup.{name}; rename the worker method")
            setattr(self, name, functools.partial(self._call_registered, name, registration))

    def __repr__(self) -> str:
        return f"WorkerGroup(role={self.role!r}, cls={self.cls.__name__}, world_size={self.world_size})"

    def _call_registered(self, method: str, registration: Any, *args: Any, **kwargs: Any) -> Any:
        dispatch = registration.dispatch
        if registration.execute is Execute.RANK_ZERO and dispatch is not Dispatch.RANK_ZERO:
            dispatch = Dispatch.RANK_ZERO
        mesh = self._mesh_info() if dispatch is Dispatch.DP_MESH else None
        plan = plan_call(dispatch, args, kwargs, self.world_size, mesh)
        refs = [self._backend.call(r, self.role, method, a, k) for r, a, k in zip(plan.ranks, plan.args, plan.kwargs)]
        future = GroupFuture(refs, plan.ranks, plan.collect, self._fetcher(method), plan.pad, plan.layout)
        return future.get() if registration.blocking else future

    def _fetcher(self, method: str):
        """Gathers one call's refs, naming ``method`` if a rank dies or hangs."""
        return lambda refs, ranks: self._backend.fetch(refs, ranks, self.role, method)

    def _mesh_info(self) -> list[Any]:
        if self._mesh is None:
            self._mesh = self.execute_all("mesh_info")
        return self._mesh

    # ---- calling any method by name ---------------------------------------------------------

    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> GroupFuture:
        ranks = list(range(self.world_size))
        refs = [self._backend.call(r, self.role, method, args, kwargs) for r in ranks]
        return GroupFuture(refs, ranks, list, self._fetcher(method))

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.execute_all_async(method, *args, **kwargs).get()

    def execute_rank_zero_async(self, method: str, *args: Any, **kwargs: Any) -> GroupFuture:
        return GroupFuture([self._backend.call(0, self.role, method, args, kwargs)], [0], lambda outs: outs[0], self._fetcher(method))

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero_async(method, *args, **kwargs).get()


# ---- building groups -----------------------------------------------------------------------


def spawn_local(specs: Mapping[str, WorkerSpec], world_size: int = 1) -> dict[str, WorkerGroup]:
    """Colocated roles on ``world_size`` in-process ranks (no Ray, no process group)."""
    hosts = [WorkerHost(specs) for _ in range(world_size)]
    for rank, host in enumerate(hosts):
        host.build(WorkerContext(rank=rank, world_size=world_size), set_threads=False)
    backend = _LocalBackend(hosts)
    return {role: WorkerGroup(role, spec.cls, backend, world_size) for role, spec in specs.items()}


def spawn_ray(
    specs: Mapping[str, WorkerSpec], pool: ResourcePool, *, name_prefix: str = "", env: Mapping[str, str] | None = None,
    distributed: bool = False, max_concurrency: int = 1, call_timeout_s: float | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> dict[str, WorkerGroup]:
    """Colocated roles on one Ray actor per bundle of ``pool``; rank order follows the pool's node order.

    ``distributed``: every rank joins the group's process group before its workers are constructed.
    ``max_concurrency`` > 1: a process runs that many calls at once, in threads (a generator
    receiving weights while it generates). ``start_timeout_s``: how long the processes may take to
    start; ``call_timeout_s``: the deadline of every call, building the workers included (None: none).
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpus, gpus = pool.share()
    host_cls = ray.remote(WorkerHost)
    prefix = name_prefix or "_".join(specs)
    actors = []
    for rank, placement in enumerate(pool.placements()):
        strategy = PlacementGroupSchedulingStrategy(placement.placement_group, placement.bundle_index)
        actors.append(
            host_cls.options(
                num_cpus=cpus,
                num_gpus=gpus,
                scheduling_strategy=strategy,
                name=f"{prefix}_rank{rank}_{os.getpid()}_{time.monotonic_ns()}",
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(max(1, math.ceil(cpus)))} | dict(env or {}) | faults.forwarded()},
                max_concurrency=max_concurrency,
            ).remote(specs)
        )
    backend = _RayBackend(actors, call_timeout_s)
    role_name = "+".join(specs)
    try:
        backend.start(role_name, start_timeout_s)
        master_addr, master_port = backend.fetch([actors[0].rendezvous.remote()], [0], role_name, "rendezvous")[0]
        contexts = [
            WorkerContext(rank, len(actors), master_addr, master_port, num_cpus=cpus, use_gpu=gpus > 0)
            for rank in range(len(actors))
        ]
        backend.fetch([a.build.remote(ctx, True, distributed) for a, ctx in zip(actors, contexts)], list(range(len(actors))), role_name, "__init__")
    except BaseException:  # a worker that failed to build (or hung, or a Ctrl-C) takes its group's processes with it
        for actor in actors:
            ray.kill(actor)
        raise
    return {role: WorkerGroup(role, spec.cls, backend, len(actors)) for role, spec in specs.items()}


def kill_group(group: WorkerGroup) -> None:
    """Stop a Ray group's processes (all roles colocated with it go too)."""
    if isinstance(group._backend, _RayBackend):
        import ray

        for actor in group._backend.actors:
            ray.kill(actor)


def spawn_pools(
    manager: Any, specs: Mapping[str, WorkerSpec], env: Mapping[str, str] | None = None, distributed: bool = False,
    call_timeout_s: float | None = None,
) -> dict[str, WorkerGroup]:
    """Every role in its pool from a :class:`ResourcePoolManager`; roles sharing a pool share processes."""
    manager.check_cluster()
    groups: dict[str, WorkerGroup] = {}
    try:
        for pool_name, roles in manager.roles_by_pool().items():
            wanted = {role: specs[role] for role in roles if role in specs}
            if wanted:
                pool = manager.pools[pool_name]  # a one-process pool (an Env-LLM of its own) joins no process group
                groups |= spawn_ray(wanted, pool, env=env, distributed=distributed and pool.world_size > 1, call_timeout_s=call_timeout_s)
    except BaseException:  # the pools spawned before a failing one are stopped and every pool is freed
        for group in groups.values():
            kill_group(group)
        for pool in manager.pools.values():
            pool.release()
        raise
    return groups
