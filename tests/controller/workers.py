"""Small worker classes for the controller tests (importable by Ray's worker processes)."""

import os
import time

import torch

from posttrain.controller import Dispatch, Execute, Worker, WorkerContext, register
from posttrain.protocol import Batch


class Doubler(Worker):
    """Doubles a column; records which rank saw which rows."""

    def __init__(self, ctx: WorkerContext, factor: float = 2.0) -> None:
        super().__init__(ctx)
        self.factor = factor
        self.state = 0

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: Batch) -> Batch:
        out = Batch.from_dict(
            {"x2": batch["x"] * self.factor, "rank": torch.full((len(batch),), self.rank)},
            meta={"metrics": {"rows_seen": len(batch)}},
        )
        return out

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, batch: Batch) -> Batch:
        return self.double(batch)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def add_one(self, batch: Batch) -> Batch:
        return Batch.from_dict({"x2": batch["x2"] + 1, "rank_again": torch.full((len(batch),), self.rank)})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def add_in_place(self, batch: Batch) -> Batch:
        batch["x"].add_(100)  # a worker may write to what it receives
        return batch

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def borrowed_keys(self, batch: Batch) -> Batch:
        return Batch.from_dict({"borrowed": torch.full((len(batch),), len(batch.borrowed))})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def owned_keys(self, batch: Batch) -> Batch:
        return Batch.from_dict({"borrowed": torch.full((len(batch),), len(batch.borrowed))})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def set_state(self, value: int) -> int:
        self.state = value
        return self.rank

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def take(self, value: int) -> tuple[int, int]:
        return self.rank, value

    @register(dispatch=Dispatch.RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def state_on_rank_zero(self) -> int:
        return self.state

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def die(self) -> None:
        os._exit(1)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sleep_then_return(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def stuck_on(self, rank: int) -> int:
        """Rank ``rank`` never returns (a deadlock, as the controller sees it); the others answer."""
        if self.rank == rank:
            while True:
                time.sleep(1)
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_on_device(self, value: float) -> tuple[float, str]:
        import torch.distributed as dist

        t = torch.tensor([value], device="cuda" if self.ctx.use_gpu else "cpu")
        dist.all_reduce(t)
        return t.item(), t.device.type

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def visible_gpus(self) -> list[str]:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]


class NeverArrives:
    """An argument whose unpickling never ends: the process it is sent to never comes up (as one that
    Ray cannot launch, or that waits for a resource no node has, looks to the controller)."""

    def __reduce__(self):
        return time.sleep, (3600,)


class Counter(Worker):
    """A second role, to colocate with Doubler in the same process."""

    def __init__(self, ctx: WorkerContext, start: int = 0) -> None:
        super().__init__(ctx)
        self.count = start

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def increment(self) -> int:
        self.count += 1
        return self.count

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class TensorParallelish(Worker):
    """Ranks 2k and 2k+1 form a 'tensor-parallel' pair sharing dp rank k; only the first answers."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.set_mesh(dp_rank=ctx.rank // 2, dp_size=ctx.world_size // 2, is_collect=ctx.rank % 2 == 0)

    @register(dispatch=Dispatch.DP_MESH)
    def compute(self, batch: Batch) -> Batch:
        return Batch.from_dict({"x": batch["x"], "rank": torch.full((len(batch),), self.rank)})


class SeesItsGroup(Worker):
    """Records, while being constructed, whether its process group already exists."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        import torch.distributed as dist

        self.group_at_construction = dist.get_world_size() if dist.is_initialized() else None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def group_seen(self) -> int | None:
        return self.group_at_construction

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def echo_later(self, batch: Batch) -> Batch:
        return batch


class FailsToBuild(Worker):
    """Rank 1 cannot be built (a bad setting found in __init__); rank 0 builds fine."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        if ctx.rank == 1:
            raise ValueError("rank 1 refuses to build")
