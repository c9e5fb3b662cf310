"""The worker base class: a plain Python object that knows its place in its group.

A worker is constructed with a :class:`WorkerContext` (rank, world size, where the group's rendezvous
is) followed by its own explicit arguments. The same class runs inside a Ray actor or, in local mode,
in the controller's process. Where the group asks for it, :meth:`Worker.init_process_group` joins a
``torch.distributed`` group across the group's ranks (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

from posttrain.controller.decorator import Dispatch, register
from posttrain.controller.memory import process_memory_gb


@dataclass(frozen=True)
class WorkerContext:
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    num_cpus: float = 1.0
    use_gpu: bool = False


@dataclass(frozen=True)
class MeshInfo:
    """A worker's place in a data-parallel mesh: its dp rank, and whether its output is collected
    (one rank of each tensor-parallel group answers; its peers get the same chunk and stay quiet)."""

    dp_rank: int
    dp_size: int
    is_collect: bool


class Worker:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self._mesh = MeshInfo(dp_rank=ctx.rank, dp_size=ctx.world_size, is_collect=True)

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    def set_mesh(self, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this worker's data-parallel rank (used by ``Dispatch.DP_MESH``)."""
        self._mesh = MeshInfo(dp_rank, dp_size, is_collect)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        """This rank's process id (to find, or stop, one worker's process from outside)."""
        return os.getpid()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def process_memory_gb(self) -> dict[str, float]:
        """This rank's process's memory in GB (``controller/memory.py: process_memory_gb``: its RSS, the
        high-water mark so far, glibc's heap in use and free), read once a step at its end, after the heap's
        free memory is handed back to the system: colocated roles share the numbers."""
        return process_memory_gb(give_back=True)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def node_id(self) -> str:
        """The id of the Ray node this rank runs on (``ray list nodes`` names its address); "local" without Ray."""
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def mesh_info(self) -> MeshInfo:
        return self._mesh

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_process_group(self) -> str:
        """Join the group's ``torch.distributed`` default process group; returns the backend."""
        return init_process_group(self.ctx)


def init_process_group(ctx: WorkerContext) -> str:
    """This process joins its group's default process group (once): gloo on CPU, NCCL on GPU."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_backend()
    backend = "nccl" if ctx.use_gpu and torch.cuda.is_available() else "gloo"
    os.environ["MASTER_ADDR"] = ctx.master_addr
    os.environ["MASTER_PORT"] = str(ctx.master_port)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, rank=ctx.rank, world_size=ctx.world_size)
    return backend


def node_address() -> str:
    """The address other ranks use to reach this process's node."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
