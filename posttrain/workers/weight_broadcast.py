"""Weights from the trainer to the generators by collective broadcast (``async.weight_transport=collective``).

A process group of its own, apart from the trainer's data-parallel group: the trainer's rank 0 is
rank 0, generator ``i`` is rank ``i + 1``. It is vLLM's ``StatelessProcessGroup`` (a TCP store the
trainer's rank 0 hosts), so the trainer's own process group is untouched. On GPUs the tensors go by
NCCL (vLLM's ``PyNcclCommunicator``, device to device); elsewhere through the store itself, which is
slow (every tensor pickled) and meant for tests of the protocol on CPU, where the object store is
the transport to use.

One broadcast: a header (version and, per tensor, name, shape and dtype) then every tensor in that
order; receivers allocate from the header, so nothing about the model is agreed beforehand.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from posttrain.workers.sampling import WeightsAtVersion


class WeightBroadcast:
    def __init__(self, host: str, port: int, rank: int, world_size: int, device: str | torch.device = "cpu") -> None:
        from vllm.distributed.utils import StatelessProcessGroup

        self.rank, self.device = rank, torch.device(device)
        self.group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self.nccl = None
        if self.device.type == "cuda":
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

            self.nccl = PyNcclCommunicator(self.group, device=self.device)

    def send(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Rank 0: ``version``'s weights to every other rank."""
        tensors = [(name, tensor.detach().to(self.device).contiguous()) for name, tensor in named_tensors]
        header = {"version": version, "tensors": [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors]}
        self.group.broadcast_obj(header, src=0)
        for _, tensor in tensors:
            self._broadcast(tensor)

    def receive(self) -> WeightsAtVersion:
        """Every other rank: the next weights rank 0 sends."""
        header = self.group.broadcast_obj(None, src=0)
        weights = {}
        for name, shape, dtype in header["tensors"]:
            weights[name] = self._broadcast(torch.empty(shape, dtype=getattr(torch, dtype), device=self.device))
        return WeightsAtVersion(int(header["version"]), weights)

    def close(self) -> None:
        """Leave the group: the NCCL communicator destroyed, the store (rank 0: its listening
        socket) released. A trainer that forms a new group after a generator was replaced closes
        the old one first, so no dead group's resources pile up over a long run. Idempotent."""
        if self.nccl is not None:
            self.nccl.destroy()
            self.nccl = None
        if self.group is not None:
            self.group.store = None
            self.group = None

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.nccl is not None:
            self.nccl.broadcast(tensor, src=0)
            return tensor
        return self.group.broadcast(tensor, src=0)
