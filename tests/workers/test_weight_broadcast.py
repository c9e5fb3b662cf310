"""The weight-broadcast group (async.weight_transport=collective): rank 0 sends a version's weights,
every other rank receives them with names, shapes, dtypes and values intact, version after version.
On CPU through the group's store; with two GPUs by NCCL."""

import threading

import pytest
import torch

from posttrain.controller.worker import free_port
from posttrain.workers.weight_broadcast import WeightBroadcast


def weights(version: int) -> list[tuple[str, torch.Tensor]]:
    return [("embed.weight", torch.arange(12, dtype=torch.float32).reshape(3, 4) * version),
            ("norm.weight", torch.full((4,), float(version), dtype=torch.bfloat16)),
            ("step", torch.tensor([version], dtype=torch.int64))]


def run_group(world: int, device_of_rank) -> dict[int, list]:
    port, received, groups, errors = free_port(), {}, [], []

    def member(rank: int) -> None:
        try:
            group = WeightBroadcast("127.0.0.1", port, rank, world, device_of_rank(rank))
            groups.append(group)  # rank 0 hosts the store: it must outlive the receivers' reads
            if rank == 0:
                for version in (1, 2):
                    group.send(version, weights(version))
            else:
                received[rank] = [group.receive() for _ in range(2)]
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return received


def check(received: dict[int, list], world: int) -> None:
    assert sorted(received) == list(range(1, world))
    for versions in received.values():
        assert [w.version for w in versions] == [1, 2]
        for published in versions:
            expected = dict(weights(published.version))
            assert list(published.weights) == list(expected)  # the sender's order
            for name, tensor in published.weights.items():
                assert tensor.dtype == expected[name].dtype and torch.equal(tensor.cpu(), expected[name])


def test_every_generator_receives_each_version_intact():
    check(run_group(3, lambda rank: "cpu"), 3)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per member: two GPUs")
def test_nccl_broadcast_between_two_gpus():
    check(run_group(2, lambda rank: f"cuda:{rank}"), 2)


def test_closing_a_group_releases_its_store_so_a_new_group_can_form_on_the_same_port():
    """A replaced generator makes the trainer form a new group: the old one is closed first, and its
    store's listening socket goes with it (nothing of a dead group is left over a long run)."""
    import socket

    port = free_port()
    group = WeightBroadcast("127.0.0.1", port, 0, 1)
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("127.0.0.1", port))  # the store listens there
    group.close()
    group.close()  # idempotent
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))  # released
    again = WeightBroadcast("127.0.0.1", port, 0, 1)
    again.close()
