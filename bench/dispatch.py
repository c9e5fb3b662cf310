"""DP_COMPUTE_PROTO overhead: a Batch through 2 Ray workers and back, against plain Ray moving the same bytes.

The Batch: 256 sequences × 2,048 tokens — input ids (int64), attention mask (int64), logprobs (float32).
  ours:     group.echo(batch): pad, chunk, send to 2 workers, workers return their chunk, concat, unpad.
            echo is registered with borrow_inputs=True, as the read-only compute methods (log probs,
            values, scores) are; a method that may write to its input (the default) costs one more
            copy of every input on the worker, printed as "owned" for reference.
  baseline: the same numpy arrays split in two, ray.put by the controller, handed to the same two actors
            (Ray gets them there), returned (Ray puts them), ray.get by the controller — the round trip with
            nothing but Ray.
Both are timed in the same run, median of repeats. Headline: ours / baseline (target <= 1.5).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import ray
import torch

from posttrain.controller import Dispatch, ResourcePool, Worker, WorkerSpec, register, spawn_ray
from posttrain.protocol import Batch

SEQS, TOKENS, REPEATS = 256, 2048, 25


class EchoWorker(Worker):
    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    def echo(self, batch: Batch) -> Batch:
        return batch

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def echo_owned(self, batch: Batch) -> Batch:
        return batch

    def echo_arrays(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays


def interleaved_medians(fns: list, repeats: int = REPEATS) -> list[float]:
    """Median seconds of each function, run in turns so that a change in machine load hits all alike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(bucket) for bucket in times]


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pool = ResourcePool("bench", [2])
    group = spawn_ray({"echo": WorkerSpec(EchoWorker)}, pool)["echo"]
    actors = group._backend.actors

    generator = torch.Generator().manual_seed(0)
    batch = Batch.from_dict({
        "input_ids": torch.randint(0, 50_000, (SEQS, TOKENS), generator=generator),
        "attention_mask": torch.ones(SEQS, TOKENS, dtype=torch.int64),
        "old_log_probs": torch.randn(SEQS, TOKENS, generator=generator),
    })
    arrays = {k: v.numpy() for k, v in batch.tensors.items()}
    megabytes = sum(a.nbytes for a in arrays.values()) / 2**20

    def ours() -> None:
        out = group.echo(batch)
        assert len(out) == SEQS

    def ours_owned() -> None:
        assert len(group.echo_owned(batch)) == SEQS

    def plain_ray() -> None:
        halves = [{k: a[i * SEQS // 2 : (i + 1) * SEQS // 2] for k, a in arrays.items()} for i in range(2)]
        refs = [ray.put(h) for h in halves]
        out = ray.get([a.call.remote("echo", "echo_arrays", r) for a, r in zip(actors, refs)])
        assert sum(len(o["input_ids"]) for o in out) == SEQS

    def put_get_once() -> None:
        ray.get(ray.put(arrays))

    t_ours, t_owned, t_plain, t_once = interleaved_medians([ours, ours_owned, plain_ray, put_get_once])
    print(f"batch: {SEQS} x {TOKENS} tokens, {megabytes:.1f} MiB; median of {REPEATS}")
    print(f"DP_COMPUTE_PROTO to 2 workers and back : {t_ours * 1e3:8.1f} ms")
    print(f"  the same, inputs copied on the worker: {t_owned * 1e3:8.1f} ms (ratio {t_owned / t_plain:.2f})")
    print(f"plain ray.put/ray.get, same round trip : {t_plain * 1e3:8.1f} ms")
    print(f"(one ray.put + ray.get on the driver   : {t_once * 1e3:8.1f} ms, for scale)")
    pool.release()
    ray.shutdown()
    print(f"dispatch_overhead_ratio: {t_ours / t_plain:.2f}")


if __name__ == "__main__":
    main()
