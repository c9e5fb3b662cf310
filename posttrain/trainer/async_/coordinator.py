"""The coordinator's side of the generators: starting them, feeding them units, replacing the dead.

Each generator is a :class:`~posttrain.rollout.generator.GeneratorWorker` in a one-process pool of
its own (``async.generator_cpus`` CPUs, ``async.generator_gpus`` GPUs on a GPU machine:
:func:`generator_pools`, which the mode hands the run's :class:`~posttrain.controller.ResourcePoolManager`
through ``trainer/roles.py``), served by
one controller thread that loops: take a unit from the scheduler (waiting while the bounds say
so), have the generator produce it, hand the result back. When the generator's process dies, the
thread reports it, puts the unit back first in line, and starts a new generator in the same pool
(at most ``MAX_RESTARTS`` times each); any other failure (a bug, an environment error, a worker the
generator calls dying) closes the scheduler with that error, and the trainer stops the run with it,
after a checkpoint.

With the collective transport the weight group is formed, and weights broadcast, only from the
trainer's thread (:meth:`Generators.broadcast` when it publishes, :meth:`Generators.maintain` while
it waits for a batch), so the trainer's workers never see two controller threads' calls at once; a
replaced generator joins at the next of either. A member that dies while NCCL is sending can hang the
send (NCCL has no timeout here); the store-based broadcast on CPU cannot.

A generator builds its rollout from the run's config (:func:`generator_config`: the run's retriever
by URL, one service for the whole run) with the very rollout classes the synchronous mode uses, and
calls the run's Env-LLM worker group.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ray.actor import ActorHandle
from ray.exceptions import RayTaskError
from rich.console import Console
from rich.markup import escape

from posttrain.config.schema import PosttrainConfig
from posttrain.controller import ResourcePool, WorkerDiedError, WorkerGroup, WorkerSpec
from posttrain.controller.worker_group import kill_group, spawn_ray
from posttrain.errors import PosttrainError
from posttrain.rollout import Rollout
from posttrain.rollout.mixture import rollout_parts
from posttrain.rollout.generator import GeneratorWorker
from posttrain.trainer.async_.buffer import UnitScheduler
from posttrain.trainer.roles import SidePool

MAX_RESTARTS = 3  # per generator: one that keeps dying (out of memory at start?) stops the run instead


class GeneratorFailure(PosttrainError):
    """What a generator's failure closes the scheduler with; its ``__cause__`` is the failure (restartable
    when that is a process that died or hung: :func:`~posttrain.errors.is_restartable`)."""

    @classmethod
    def caused_by(cls, message: str, cause: BaseException) -> GeneratorFailure:
        """A failure that is not raised here (it closes the scheduler), with ``cause`` chained as ``raise ... from`` would."""
        failure = cls(message)
        failure.__cause__ = cause
        return failure


def generator_pools(config: PosttrainConfig) -> tuple[SidePool, ...]:
    """``generator_0`` … : one pool each, taken out of this machine before the trainer's share (``trainer/roles.py``)."""
    options = config.async_
    return tuple(SidePool(f"generator_{i}", options.generator_cpus, options.generator_gpus,
                          f"each of async.num_generators={options.num_generators} generators") for i in range(options.num_generators))


def retriever_urls(rollout: Rollout) -> dict[str | None, str]:
    """The retrievers the controller's rollout opened, by URL: ``{None: url}``, or a mixture's by source name."""
    return {name: part.retriever.client.url for name, _, part in rollout_parts(rollout, None) if getattr(part, "retriever", None)}


def generator_config(config: PosttrainConfig, retriever_urls: Mapping[str | None, str]) -> PosttrainConfig:
    """The run's config as generators see it: the retrievers the controller opened, by URL (a mixture's
    source's in its own ``env``), so that generators search the same service instead of starting their own."""
    config = copy.deepcopy(config)
    for name, url in retriever_urls.items():
        if name is None:
            config.env.retriever.url = url
            continue
        entry = next(entry for entry in config.mixture if entry["name"] == name)
        entry.setdefault("env", {}).setdefault("retriever", {})["url"] = url
    return config


class Generators:
    def __init__(
        self, config: PosttrainConfig, data_dir: Path | None, scheduler: UnitScheduler, board: ActorHandle, trainer: WorkerGroup,
        env_llm: WorkerGroup | None, pools: list[ResourcePool], run_dir: Path, env: dict[str, str], on_gpu: bool,
    ) -> None:
        self.config, self.data_dir, self.scheduler, self.board, self.env_llm = config, data_dir, scheduler, board, env_llm
        self.trainer, self.run_dir, self.env, self.pools = trainer, run_dir, env, pools
        transport = config.async_.weight_transport
        # NCCL needs each member on a GPU of its own: auto picks it only for whole-GPU generators
        self.collective = transport == "collective" or (transport == "auto" and on_gpu and config.async_.generator_gpus >= 1)
        self.members: dict[int, WorkerGroup] = {}  # the generators in the current weight group, by index
        self.groups: list[WorkerGroup | None] = [None] * len(self.pools)
        self.threads: list[threading.Thread] = []
        self.restarts = 0
        self.restarts_of = [0] * len(self.pools)
        self.produced_samples = 0
        self.busy_s = [0.0] * len(self.pools)
        self.started_at = time.perf_counter()
        self.console = Console(stderr=True)
        self.stopping = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every generator's process (each builds its engine); :meth:`serve` then hands out units."""
        for i in range(len(self.pools)):
            self.groups[i] = self._spawn(i)
        self.trainer_pids = self.trainer.pid()  # asked once, here: only the trainer's thread calls the trainer
        self._write_pids()

    def serve(self) -> None:
        """One thread per generator: take a unit, have it produced, hand the result back."""
        self.started_at = time.perf_counter()
        for i in range(len(self.pools)):
            thread = threading.Thread(target=self._serve, args=(i,), name=f"generator-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _spawn(self, i: int) -> WorkerGroup:
        spec = WorkerSpec(GeneratorWorker, (self.config, self.data_dir), {"board": self.board, "env_llm": self.env_llm, "generator_index": i})
        # two calls at once: a broadcast of new weights is received while a unit is produced
        return spawn_ray({"generator": spec}, self.pools[i], name_prefix=f"generator{i}", env=self.env, max_concurrency=2,
                         call_timeout_s=self.config.trainer.call_timeout_s)["generator"]

    # ---- the collective transport: called from the trainer's thread only ----------------------

    def broadcast(self, version: int) -> None:
        """The trainer's weights to every generator of the weight group, as ``version``; the group is
        formed first when its members changed (a generator replaced). A generator that dies while
        receiving is left to its serving thread; the next broadcast re-forms the group without it."""
        if self._members_changed():
            self._form_weight_group()
        receiving = [group.receive_weights() for group in self.members.values()]
        self.trainer.broadcast_weights(version)  # the trainer's own failure propagates: the run stops
        for future in receiving:
            try:
                future.get()
            except Exception:  # noqa: BLE001 - a dead or replaced member; its thread reports and replaces it
                self.members = {}

    def maintain(self, version: int) -> None:
        """While the trainer waits: a replaced generator joins the group and gets ``version``."""
        if self.collective and version > 0 and self._members_changed():
            self.broadcast(version)

    def _members_changed(self) -> bool:
        with self._lock:
            live = {i: group for i, group in enumerate(self.groups) if group is not None}
        return live.keys() != self.members.keys() or any(self.members[i] is not group for i, group in live.items())

    def _form_weight_group(self) -> None:
        """The trainer's rank 0 and every live generator join a new broadcast group."""
        with self._lock:
            members = {i: group for i, group in enumerate(self.groups) if group is not None}
        host, port = self.trainer.weight_group_address()
        world = 1 + len(members)
        joining = [self.trainer.join_weight_group(host, port, world)]
        joining += [group.join_weight_group(host, port, rank, world) for rank, group in enumerate(members.values(), start=1)]
        for future in joining:
            future.get()
        self.members = members

    # ---- serving ------------------------------------------------------------------------------

    def _write_pids(self) -> None:
        """Which process is which worker (for a person, or a test, that wants to find one): ``processes.json``."""
        pids = {"trainer": self.trainer_pids} | {f"generator_{i}": group.pid()[0] for i, group in enumerate(self.groups) if group is not None}
        (self.run_dir / "processes.json").write_text(json.dumps(pids))

    def _serve(self, i: int) -> None:
        try:
            while (unit := self.scheduler.next_unit()) is not None:
                start = time.perf_counter()
                try:
                    result = self.groups[i].produce(unit.index, unit.prompts, unit.batch_index, unit.row_offset)
                except WorkerDiedError as err:
                    self.scheduler.requeue(unit)
                    if isinstance(err.__cause__, RayTaskError):  # a worker it called died (an Env-LLM, the weight board), not the generator
                        raise
                    if self.stopping or not self._replace(i, err):
                        return
                    continue
                with self._lock:
                    self.busy_s[i] += time.perf_counter() - start
                    self.produced_samples += len(result.batch)
                self.scheduler.finish(unit, result)
        except BaseException as err:  # noqa: BLE001 - any other failure stops the run, with its message
            self.scheduler.close(GeneratorFailure.caused_by(f"generator {i} failed: {type(err).__name__}: {err}", err))

    def _replace(self, i: int, err: Exception) -> bool:
        with self._lock:
            self.restarts += 1
            self.restarts_of[i] += 1
            dead, self.groups[i] = self.groups[i], None
        if self.restarts_of[i] > MAX_RESTARTS:
            # no cause chained: a generator that keeps dying is not cured by restarting the run
            self.scheduler.close(GeneratorFailure(f"generator {i} died {self.restarts_of[i]} times; the last: {err}"))
            return False
        self.console.print(f"[yellow]posttrain: generator {i} died ({escape(str(err))}); starting a new one, its unit goes back in line[/]")
        kill_group(dead)
        replacement = self._spawn(i)
        with self._lock:
            if self.stopping:
                kill_group(replacement)
                return False
            self.groups[i] = replacement
        self._write_pids()
        return True

    def metrics(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.started_at, 1e-9)
        with self._lock:
            busy = sum(self.busy_s) / len(self.busy_s)
            return {
                "async/generator_restarts": float(self.restarts),
                "async/generated_samples_per_s": self.produced_samples / elapsed,
                "async/generator_idle_fraction": max(0.0, 1.0 - busy / elapsed),
            }

    def stop(self) -> None:
        """Close the scheduler, let the threads end (an in-flight unit is abandoned), stop the processes."""
        with self._lock:
            self.stopping = True
        self.scheduler.close()
        for group in self.groups:
            if group is not None:
                kill_group(group)
        for thread in self.threads:
            thread.join(timeout=10)
        for pool in self.pools:
            pool.release()
