"""Saving and restoring a training engine's complete state, so a resumed run continues identically.

A checkpoint directory holds

    model.pt           full (unsharded) float32 state dict, peft names with LoRA
    optimizer.pt       full AdamW state, keyed by parameter name (so any sharding can reload it)
    scheduler.pt       the LR scheduler's state
    engine_state.json  the engine's counters (optimizer steps taken, steps skipped) and world size
    rng/rank_<r>.pt    each rank's random state: torch CPU and CUDA, numpy, Python

Full state dicts go through ``torch.distributed.checkpoint.state_dict``, which gathers FSDP2
shards on save and re-shards on load, so a checkpoint written by N ranks loads on M ranks (the
random states then come from the ranks that exist in both). Rank 0 writes the shared files; every
rank reads them. Loading uses ``weights_only=True``: only tensors and plain values are unpickled.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from posttrain.engines.training.parallel import barrier
from posttrain.errors import MissingFileError

_MODEL = "model.pt"
_OPTIMIZER = "optimizer.pt"
_SCHEDULER = "scheduler.pt"
_ENGINE_STATE = "engine_state.json"


def _rng_file(directory: Path, rank: int) -> Path:
    return directory / "rng" / f"rank_{rank}.pt"


def _rng_state() -> dict[str, Any]:
    algorithm, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"algorithm": algorithm, "keys": torch.from_numpy(keys.astype(np.int64)), "position": position,
                  "has_gauss": has_gauss, "cached_gaussian": cached_gaussian},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["algorithm"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    directory: str | Path,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    engine_state: dict[str, Any],
    rank: int,
) -> Path:
    """Write the checkpoint (module docstring). Every rank must call it; returns the directory."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    directory = Path(directory)
    # Gathered to rank 0's CPU only; the other ranks take part in the gathers and get nothing.
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(module, options=options)
    optimizer_state = get_optimizer_state_dict(module, optimizer, options=options)
    _rng_file(directory, rank).parent.mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), _rng_file(directory, rank))
    if rank == 0:
        torch.save(model_state, directory / _MODEL)
        torch.save(optimizer_state, directory / _OPTIMIZER)
        torch.save(scheduler.state_dict(), directory / _SCHEDULER)
        (directory / _ENGINE_STATE).write_text(json.dumps(engine_state, indent=2))
    barrier()
    return directory


def load_weights(directory: str | Path, *, module: nn.Module) -> None:
    """Only the model's weights of a :func:`save_checkpoint` directory, in place (no optimizer, schedule or RNG)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    path = Path(directory) / _MODEL
    if not path.is_file():
        raise MissingFileError(f"{directory} holds no {_MODEL}: pass a directory written by TrainingEngine.save_checkpoint")
    set_model_state_dict(module, torch.load(path, weights_only=True), options=StateDictOptions(full_state_dict=True))


def load_checkpoint(
    directory: str | Path,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    rank: int,
) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote, in place; returns the saved engine state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    directory = Path(directory)
    missing = [name for name in (_MODEL, _OPTIMIZER, _SCHEDULER, _ENGINE_STATE) if not (directory / name).is_file()]
    if missing:
        raise MissingFileError(
            f"{directory} is not a complete training-engine checkpoint (missing {', '.join(missing)}); "
            "pass a directory written by TrainingEngine.save_checkpoint"
        )
    options = StateDictOptions(full_state_dict=True)
    load_weights(directory, module=module)
    set_optimizer_state_dict(module, optimizer, torch.load(directory / _OPTIMIZER, weights_only=True), options=options)
    scheduler.load_state_dict(torch.load(directory / _SCHEDULER, weights_only=True))
    rng_file = _rng_file(directory, rank)
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return json.loads((directory / _ENGINE_STATE).read_text())
