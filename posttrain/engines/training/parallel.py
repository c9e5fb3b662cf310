"""Data parallelism for the training engine: DDP or FSDP2 over the default process group.

The process group is the caller's (``Worker.init_process_group``: gloo on CPU, NCCL on GPU); with
none, or a world of one, the engine runs single-process.

Gradients are *summed* over ranks. The losses follow ``posttrain.algos.aggregation``: every
micro-batch's loss is divided by the normaliser of the whole mini-batch on all ranks, so the
losses of all micro-batches on all ranks add up to the mini-batch loss. DDP and FSDP2 average
gradients over ranks; the engine multiplies each loss by the world size before ``backward`` to
turn that mean into the sum (exact in floating point for a power-of-two world).

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards each decoder layer (the classes the model
lists in ``_no_split_modules``) and then the root, which holds the embeddings and heads; with
bf16 it gathers parameters in bf16 and reduces gradients in float32 (``MixedPrecisionPolicy``),
and with ``cpu_offload`` keeps the float32 shards, their gradients and the optimizer state on the
CPU (``CPUOffloadPolicy``). It also runs on CPU over gloo, which is how the tests exercise it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1


def dist_info() -> DistInfo:
    """This process's rank and the world size of the default process group (0 and 1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size())
    return DistInfo()


def resolve_device(setting: str) -> torch.device:
    """``cuda`` (the current device, which ``init_process_group`` set per rank) or ``cpu``."""
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' but torch sees no CUDA device; use device='auto' or 'cpu'")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_strategy(setting: str, device: torch.device, world_size: int) -> str:
    """``none``, ``ddp`` or ``fsdp``; ``auto`` picks none for one rank, ddp on CPU, fsdp on CUDA."""
    if setting == "auto":
        if device.type == "cuda":
            return "fsdp" if dist.is_initialized() else "none"
        return "ddp" if world_size > 1 else "none"
    if setting in ("ddp", "fsdp") and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"strategy={setting!r} needs a torch.distributed process group; call the worker's "
            "init_process_group() before building the engine, or use strategy='auto'"
        )
    if setting == "none" and world_size > 1:
        raise ValueError(
            f"strategy='none' with {world_size} ranks would train {world_size} diverging copies; use 'ddp' or 'fsdp'"
        )
    return setting


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """DDP over the default group. Buffers are not re-broadcast each forward (none of them train),
    so a forward pass holds no collective and ranks may run different numbers of them."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
    )


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (FSDP2 shards them one by one; ``compile`` compiles each)."""
    # HF models name their repeated block classes in _no_split_modules; a peft wrapper hides them
    # one level down, so look through every submodule.
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or [])
    return [sub for sub in module.modules() if type(sub).__name__ in names]


def apply_fsdp2(module: nn.Module, device: torch.device, dtype: torch.dtype, cpu_offload: bool) -> nn.Module:
    """Shard ``module`` in place over all ranks (see the module docstring); returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    layers = decoder_layers(module)
    if not layers:
        raise ValueError(
            f"{type(module).__name__} names no decoder-layer classes in _no_split_modules, so FSDP2 "
            "cannot shard it layer by layer; use strategy='ddp' for this model"
        )
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(module, **options)
    return module


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(tensor: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """``tensor`` reduced over all ranks (a copy, on ``tensor``'s device); itself for one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    reduced = tensor.detach().to(_comm_device(), copy=True)
    dist.all_reduce(reduced, op=op)
    return reduced.to(tensor.device)


def max_over_ranks(value: int) -> int:
    """The largest ``value`` any rank passed (a collective)."""
    return int(all_reduce(torch.tensor(value), dist.ReduceOp.MAX))


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def full_tensor(tensor: Tensor) -> Tensor:
    """A DTensor gathered into a plain tensor (a collective: every rank must call it); others as they are."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor
    mesh_device = tensor.device_mesh.device_type
    if tensor.device.type != mesh_device:  # CPU-offloaded shards travel through the GPU's group
        tensor = tensor.to(mesh_device)
    return tensor.full_tensor()


def grad_norm(parameters: list[nn.Parameter]) -> float:
    """The global L2 norm of the gradients (inf or nan if any is not finite); ranks agree on it."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    return float(full_tensor(torch.nn.utils.get_total_norm(grads, norm_type=2.0)))


def scale_grads_(parameters: list[nn.Parameter], factor: float) -> None:
    """Multiply every gradient by ``factor`` in place (gradient clipping)."""
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.grad.mul_(factor)
