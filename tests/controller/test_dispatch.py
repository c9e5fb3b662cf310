"""Every dispatch mode, in local mode (no Ray) and on a local Ray cluster of CPU bundles."""

import pytest
import torch

from posttrain.controller import ResourcePool, WorkerSpec, spawn_local, spawn_ray
from posttrain.protocol import Batch
from tests.controller.workers import Doubler, TensorParallelish


def batch(n: int) -> Batch:
    return Batch.from_dict({"x": torch.arange(n, dtype=torch.float32)})


@pytest.fixture(params=["local", "ray"])
def doublers(request):
    spec = {"doubler": WorkerSpec(Doubler, kwargs={"factor": 2.0})}
    if request.param == "local":
        yield spawn_local(spec, world_size=2)["doubler"]
        return
    request.getfixturevalue("ray_local")
    pool = ResourcePool("test", bundles_per_node=[2])
    yield spawn_ray(spec, pool)["doubler"]
    pool.release()


def test_dp_compute_proto_pads_chunks_and_unpads(doublers):
    out = doublers.double(batch(5))  # 5 rows over 2 ranks: padded to 6, 3 rows each
    assert out["x2"].tolist() == [0, 2, 4, 6, 8]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.metrics == {"rows_seen": [3, 3]}  # per-worker metrics survive the collect


def test_non_blocking_futures_chain_without_the_controller(doublers):
    first = doublers.double_async(batch(5))
    second = doublers.add_one(first)  # each rank gets its own piece of `first`
    out = second.get()
    assert out["x2"].tolist() == [1, 3, 5, 7, 9]
    assert out["rank_again"].tolist() == [0, 0, 0, 1, 1]  # pieces stayed on the rank that made them


def test_one_to_all_all_to_all_rank_zero(doublers):
    assert doublers.set_state(7) == [0, 1]
    assert doublers.state_on_rank_zero() == 7
    assert doublers.take([10, 20]) == [(0, 10), (1, 20)]
    with pytest.raises(ValueError, match="one entry per rank"):
        doublers.take([10])
    assert doublers.whoami() == 0


def test_execute_all_and_rank_zero_sync_and_async(doublers):
    assert doublers.execute_all("sleep_then_return", 0.0) == [0, 1]
    assert doublers.execute_all_async("sleep_then_return", 0.0).get() == [0, 1]
    assert doublers.execute_rank_zero("sleep_then_return", 0.0) == 0
    assert doublers.execute_rank_zero_async("sleep_then_return", 0.0).get() == 0


def test_dp_mesh_sends_tensor_parallel_peers_the_same_chunk_and_collects_one():
    group = spawn_local({"tp": WorkerSpec(TensorParallelish)}, world_size=4)["tp"]
    out = group.compute(batch(4))
    assert out["x"].tolist() == [0, 1, 2, 3]
    assert out["rank"].tolist() == [0, 0, 2, 2]  # dp rank 0 answered by rank 0, dp rank 1 by rank 2


def test_dp_mesh_on_ray(ray_local):
    pool = ResourcePool("mesh", bundles_per_node=[4], cpus_per_bundle=0.5)
    group = spawn_ray({"tp": WorkerSpec(TensorParallelish)}, pool)["tp"]
    out = group.compute(batch(3))
    assert out["x"].tolist() == [0, 1, 2]
    assert out["rank"].tolist() == [0, 0, 2]
    pool.release()


def test_received_batches_are_writable_on_both_sides_and_the_input_is_untouched(doublers):
    sent = batch(4)
    out = doublers.add_in_place(sent)
    assert out["x"].tolist() == [100, 101, 102, 103]
    assert sent["x"].tolist() == [0, 1, 2, 3]
    out["x"].add_(1)  # the controller may write to what it gets back
    assert out["x"].tolist() == [101, 102, 103, 104]


def test_a_batch_from_the_object_store_is_borrowed_until_owned(ray_local):
    received = ray_local.get(ray_local.put(batch(3)))
    assert received.borrowed == {"x"}  # still the store's read-only memory, no copy made
    owned = received.owned()
    assert owned.borrowed == frozenset()
    owned["x"].add_(1)
    assert owned["x"].tolist() == [1, 2, 3]


def test_a_future_split_one_way_is_re_split_for_a_call_split_another_way():
    from tests.controller.workers import SeesItsGroup

    groups = spawn_local({"tp": WorkerSpec(TensorParallelish), "echo": WorkerSpec(SeesItsGroup)}, world_size=4)
    future = groups["echo"].echo_later(batch(8))  # DP_COMPUTE_PROTO: 2 rows on each of 4 ranks
    out = groups["tp"].compute(future)  # DP_MESH: 2 data-parallel ranks of 4 rows
    assert out["x"].tolist() == list(range(8))


def test_borrow_inputs_skips_the_copy_only_where_declared(ray_local):
    pool = ResourcePool("borrow", bundles_per_node=[2])
    group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
    assert group.borrowed_keys(batch(4))["borrowed"].tolist() == [1, 1, 1, 1]  # x stays in shared memory
    assert group.owned_keys(batch(4))["borrowed"].tolist() == [0, 0, 0, 0]  # copied before the method runs
    pool.release()
