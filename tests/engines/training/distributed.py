"""What each of two spawned gloo ranks runs in test_distributed.py (importable, for the spawn start method).

Every rank writes what it saw to ``<out_dir>/rank<r>.pt``; the parent test compares it with a
single-process engine. A collective that one rank misses fails on the process group's timeout
instead of hanging the test run.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from tests.engines.training.helpers import (
    counting_fused_head,
    engine_config,
    make_batch,
    parameters,
    ppo_loss,
    trained,
    with_zero_advantages,
)

WORLD_SIZE = 2
# eps = 1 keeps AdamW's first step nearly linear in the gradient; no clipping, so a gradient that
# was averaged instead of summed over ranks would show as half the update.
EXACT = {"eps": 1.0, "lr": 1e-2, "grad_clip": None}
UNEVEN_ROWS = ([0], list(range(1, 8)))  # rank 0: 1 sample; rank 1: 7 samples
TIED_MICRO_BATCH = 2  # each rank's 4 samples in 2 micro-batches
UNEVEN_MAX_TOKENS = 16  # row 0 alone fills it: rank 1 needs several micro-batches, rank 0 pads
SKIPPED_ROWS = [0, 1, 2, 3, 5]


def even_rows(rank: int, batch_size: int = 8) -> list[int]:
    share = batch_size // WORLD_SIZE
    return list(range(rank * share, (rank + 1) * share))


def run_rank(rank: int, model_dir: str, tied_model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A file rendezvous: no port to pick, so no race with other processes for one.
    store = f"file://{Path(out_dir) / 'rendezvous'}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=120))
    try:
        results = {strategy: _even_step(strategy, rank, Path(model_dir)) for strategy in ("ddp", "fsdp")}
        with counting_fused_head() as calls:  # tied embeddings, gradients accumulated over 2 micro-batches
            results["fsdp_tied"] = _even_step("fsdp", rank, Path(tied_model_dir), micro_batch_size=TIED_MICRO_BATCH)
        results["fsdp_tied"]["fused_head_calls"] = len(calls)
        results["uneven"] = _uneven_fsdp(rank, Path(model_dir), Path(out_dir))
        results["skipping"] = _skipping_fsdp(rank, Path(model_dir))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _even_step(strategy: str, rank: int, model_dir: Path, micro_batch_size: int = 4) -> dict:
    """Each rank half the mini-batch (one micro-batch by default)."""
    engine = TrainingEngine(engine_config(model_dir, strategy=strategy, **EXACT))
    assert engine.strategy == strategy
    metrics = trained(engine, make_batch(8, seed=1).index(even_rows(rank)), ppo_loss, micro_batch_size=micro_batch_size)
    return {"metrics": metrics, "params": parameters(engine)}


def skipping_batch():
    """Rows 0-3 (all of rank 0's) and 5 with advantage 0: rank 0 runs nothing, rank 1 three rows."""
    return with_zero_advantages(make_batch(8, seed=3), SKIPPED_ROWS)


def _skipping_fsdp(rank: int, model_dir: Path) -> dict:
    engine = TrainingEngine(engine_config(model_dir, strategy="fsdp", **EXACT))
    share = skipping_batch().index(even_rows(rank))
    skip = (share[keys.ADVANTAGES] == 0).all(dim=1)
    metrics = trained(engine, share, ppo_loss, micro_batch_size=1, skip_rows=skip)
    return {"metrics": metrics, "params": parameters(engine)}


def _uneven_fsdp(rank: int, model_dir: Path, out_dir: Path) -> dict:
    """FSDP with different micro-batch counts per rank, then a checkpoint, a second step and an export."""
    engine = TrainingEngine(engine_config(model_dir, strategy="fsdp", warmup_steps=2, **EXACT))
    rows = UNEVEN_ROWS[rank]
    batch = make_batch(8, seed=1)
    logprobs, _ = engine.compute_logprobs(batch.index(rows), max_tokens=UNEVEN_MAX_TOKENS)
    first = trained(engine, batch.index(rows), ppo_loss, max_tokens=UNEVEN_MAX_TOKENS)
    engine.save_checkpoint(out_dir / "fsdp_checkpoint")
    second = trained(engine, make_batch(8, seed=2).index(even_rows(rank)), ppo_loss, micro_batch_size=2)
    engine.export_hf(out_dir / "fsdp_export")
    return {"logprobs": logprobs, "first": first, "second": second, "params": parameters(engine)}
