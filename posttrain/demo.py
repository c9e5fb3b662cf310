"""``posttrain demo``: the single controller at work on local Ray, with no model.

Two ranks in one CPU pool, two colocated roles per process, a gloo process group across the ranks,
and a Batch sent through DP_COMPUTE_PROTO and back. It prints what ran where.
"""

from __future__ import annotations

import os
import time

import torch
from rich.console import Console

from posttrain.controller import Dispatch, ResourcePool, ResourcePoolManager, Worker, WorkerContext, WorkerSpec, register, spawn_pools
from posttrain.protocol import Batch


class SquareWorker(Worker):
    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def square(self, batch: Batch) -> Batch:
        return Batch.from_dict({"squared": batch["x"] ** 2, "rank": torch.full((len(batch),), self.rank)})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self, value: float) -> float:
        import torch.distributed as dist

        total = torch.tensor([value])
        dist.all_reduce(total)
        return total.item()


class TallyWorker(Worker):
    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[int, int]:
        self.calls += 1
        return self.rank, os.getpid()


def run_demo(ranks: int = 2, rows: int = 7) -> None:
    import ray

    console = Console()
    start = time.perf_counter()
    ray.init(num_cpus=max(2, ranks), include_dashboard=False, log_to_driver=False)
    try:
        manager = ResourcePoolManager({"cpu": ResourcePool("cpu", [ranks])}, {"square": "cpu", "tally": "cpu"})
        groups = spawn_pools(manager, {"square": WorkerSpec(SquareWorker), "tally": WorkerSpec(TallyWorker)})
        console.print(f"[bold]started[/] {ranks} worker processes in {time.perf_counter() - start:.1f} s")
        for rank, pid in groups["tally"].where():
            console.print(f"  rank {rank}: pid {pid} hosts roles 'square' and 'tally'")
        backends = groups["square"].init_process_group()
        sums = groups["square"].all_reduce_sum(1.0)
        console.print(f"process group {backends[0]}: all-reduce of 1.0 from each rank -> {sums}")
        out = groups["square"].square(Batch.from_dict({"x": torch.arange(rows, dtype=torch.float32)}))
        console.print(f"DP_COMPUTE_PROTO over {ranks} ranks ({rows} rows, padded to a multiple of {ranks}):")
        console.print(f"  squared = {out['squared'].tolist()}")
        console.print(f"  rank    = {out['rank'].tolist()}")
        manager.pools["cpu"].release()
    finally:
        ray.shutdown()
    console.print(f"[green]done[/] in {time.perf_counter() - start:.1f} s")
