"""Worker groups on Ray: colocation, process groups, dead, stuck and unstartable workers, pools that
cannot be placed, pools across two nodes."""

import re
import time
from pathlib import Path

import pytest
import torch

from posttrain.controller import (
    ResourceError,
    ResourcePool,
    ResourcePoolManager,
    WorkerDiedError,
    WorkerHungError,
    WorkerSpec,
    WorkerStartError,
    kill_group,
    spawn_local,
    spawn_pools,
    spawn_ray,
)
from posttrain.protocol import Batch
from tests.controller.workers import Counter, Doubler, FailsToBuild, NeverArrives

pytestmark = pytest.mark.ray


def test_colocated_roles_share_a_process_but_keep_their_own_classes(ray_local):
    manager = ResourcePoolManager(
        pools={"shared": ResourcePool("shared", [2])}, role_to_pool={"doubler": "shared", "counter": "shared"}
    )
    groups = spawn_pools(manager, {"doubler": WorkerSpec(Doubler), "counter": WorkerSpec(Counter, kwargs={"start": 10})})
    assert groups["doubler"].pid() == groups["counter"].pid()  # one process per rank, both roles in it
    assert len(set(groups["doubler"].pid())) == 2
    assert groups["counter"].increment() == [11, 11]
    assert not hasattr(groups["counter"], "double")  # each role exposes only its own methods
    assert groups["doubler"].double(Batch.from_dict({"x": torch.ones(2)}))["x2"].tolist() == [2, 2]
    manager.pools["shared"].release()


def test_roles_in_separate_pools_get_separate_processes(ray_local):
    manager = ResourcePoolManager(
        pools={"a": ResourcePool("a", [1]), "b": ResourcePool("b", [1])}, role_to_pool={"doubler": "a", "counter": "b"}
    )
    groups = spawn_pools(manager, {"doubler": WorkerSpec(Doubler), "counter": WorkerSpec(Counter)})
    assert groups["doubler"].pid() != groups["counter"].pid()
    for pool in manager.pools.values():
        pool.release()


def test_gloo_all_reduce_across_two_ranks(ray_local):
    pool = ResourcePool("dist", [2])
    group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
    assert group.init_process_group() == ["gloo", "gloo"]
    assert group.all_reduce(1.5) == [3.0, 3.0]  # 1.5 + 1.5 from the two ranks
    pool.release()


def test_distributed_groups_exist_before_workers_are_built(ray_local):
    from tests.controller.workers import SeesItsGroup

    pool = ResourcePool("early", [2])
    group = spawn_ray({"w": WorkerSpec(SeesItsGroup)}, pool, distributed=True)["w"]
    assert group.group_seen() == [2, 2]  # a training engine built in __init__ can pick DDP
    pool.release()


def test_a_dead_worker_is_named_within_seconds(ray_local):
    pool = ResourcePool("doomed", [2])
    group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
    group.execute_rank_zero_async("die")
    time.sleep(1.0)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"'doubler' rank 0 died during sleep_then_return\(\)") as died:
        group.sleep_then_return(30.0)  # rank 1 would answer in 30 s; the error must not wait for it
    assert time.monotonic() - start < 10
    log = re.search(r"stderr in (\S+\.err)", str(died.value))
    assert log and Path(log.group(1)).is_file()  # the dead process's own log file, named
    kill_group(group)
    pool.release()


def test_a_stuck_worker_is_named_with_its_rank_and_method_once_the_deadline_passes(ray_local):
    pool = ResourcePool("stuck", [2])
    group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool, call_timeout_s=3.0)["doubler"]
    pids = group.pid()
    start = time.monotonic()
    with pytest.raises(WorkerHungError, match=r"'doubler' rank\(s\) \[1\] did not answer stuck_on\(\) within 3 s") as hung:
        group.stuck_on(1)  # rank 0 answers at once, rank 1 never
    assert 3.0 <= time.monotonic() - start < 8
    assert (hung.value.role, hung.value.ranks, hung.value.method) == ("doubler", [1], "stuck_on")
    assert f"pid {pids[1]}" in str(hung.value) and f"pid {pids[0]}" not in str(hung.value)
    kill_group(group)
    pool.release()


def test_a_worker_process_that_cannot_start_fails_within_the_start_timeout(ray_local):
    pool = ResourcePool("unstartable", [1])
    start = time.monotonic()
    with pytest.raises(WorkerStartError, match=r"'doubler' rank\(s\) \[0\].*within 5 s.*raylet.err"):
        spawn_ray({"doubler": WorkerSpec(Doubler, kwargs={"factor": NeverArrives()})}, pool, start_timeout_s=5.0)
    assert time.monotonic() - start < 20
    pool.release()


def test_a_group_that_fails_to_build_leaves_no_process_behind(ray_local):
    from ray._private import state

    pool = ResourcePool("failing", [2])
    # the error is kept, as a caller that reports it keeps it: its traceback holds the actors' handles
    with pytest.raises(Exception, match="rank 1 refuses to build") as error:
        spawn_ray({"fails": WorkerSpec(FailsToBuild)}, pool, name_prefix="fails_to_build")
    deadline = time.monotonic() + 10
    while True:  # Ray ends killed actors asynchronously
        alive = [a for a in state.actors().values() if a["Name"].startswith("fails_to_build") and a["State"] != "DEAD"]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, alive  # rank 0 built fine, and is stopped with its failing peer
    # what the caller gets is the worker's own exception, with the worker's file and line in its message
    assert isinstance(error.value, ValueError)
    assert str(error.value).endswith("ValueError: rank 1 refuses to build")
    assert re.search(r'tests/controller/workers\.py", line \d+, in __init__', str(error.value))
    # and the kept traceback does hold the handles of both actors (spawn_ray's frame), so the check above means something
    assert [len(entry.locals["actors"]) for entry in error.traceback if "actors" in entry.locals][:1] == [2]
    pool.release()


def test_bundles_that_never_become_free_are_refused_after_the_ready_timeout(ray_local):
    holder = ResourcePool("holder", [3])
    holder.placements()  # 3 of the 4 CPUs
    waiting = ResourcePool("waiting", [2], ready_timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(ResourceError, match=r"asks for 1 node\(s\) with bundles \[2\].*after 2 s the cluster has 1 CPU, 0 GPU free"):
        waiting.placements()
    assert time.monotonic() - start < 10
    holder.release()
    after = ResourcePool("after", [2])
    assert len(after.placements()) == 2  # the refused request left nothing behind
    after.release()


def test_a_share_no_node_can_hold_is_refused_at_once(ray_local):
    start = time.monotonic()
    with pytest.raises(ResourceError, match=r"needs 64 CPU, 0 GPU on one node .* no node has that: .*: 4 CPU"):
        ResourcePool("too_big", [1], cpus_per_bundle=64).placements()
    assert time.monotonic() - start < 5


def test_a_pool_of_more_nodes_than_the_cluster_has_is_refused_at_once(ray_local):
    start = time.monotonic()
    with pytest.raises(ResourceError, match=r"needs 2 different nodes with 1 CPU, 0 GPU each, and the cluster has 1 such node"):
        ResourcePool("two_nodes", [1, 1]).placements()
    assert time.monotonic() - start < 5


def test_a_pool_larger_than_the_cluster_fails_with_the_numbers(ray_local):
    manager = ResourcePoolManager(pools={"huge": ResourcePool("huge", [64])}, role_to_pool={"doubler": "huge"})
    with pytest.raises(ResourceError, match="need 64 CPU"):
        spawn_pools(manager, {"doubler": WorkerSpec(Doubler)})


def test_bad_pool_and_role_mappings_are_refused():
    with pytest.raises(ValueError, match="bundles_per_node"):
        ResourcePool("p", [])
    with pytest.raises(ValueError, match="undefined pools"):
        ResourcePoolManager(pools={}, role_to_pool={"actor": "missing"})


def test_local_mode_runs_in_this_process():
    import os

    group = spawn_local({"c": WorkerSpec(Counter)}, world_size=2)["c"]
    assert group.pid() == [os.getpid(), os.getpid()]
    assert group.increment() == [1, 1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_node_cluster_ranks_follow_node_order():
    import ray
    from ray.cluster_utils import Cluster

    from tests.conftest import worker_runtime_env

    ray.shutdown()
    cluster = Cluster()
    cluster.add_node(num_cpus=8, resources={"node_a": 1})
    cluster.add_node(num_cpus=2, resources={"node_b": 1})
    try:
        # The workers' PYTHONPATH was the repository alone: on a machine whose Ray itself comes from
        # PYTHONPATH they could not start, and the test hung (now: WorkerStartError)
        ray.init(address=cluster.address, runtime_env=worker_runtime_env())
        # one bundle per node: the head could hold both, and Ray alone puts both there
        small = ResourcePool("small", bundles_per_node=[1, 1])
        assert len({p.node_id for p in small.placements()}) == 2
        small.release()
        pool = ResourcePool("spread", bundles_per_node=[2, 2])
        group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
        node_ids = group.node_id()
        assert len(set(node_ids)) == 2
        assert node_ids[0] == node_ids[1] and node_ids[2] == node_ids[3]  # ranks grouped by node
        order = {n["NodeID"]: (n["NodeManagerAddress"], n.get("NodeName", "")) for n in ray.nodes()}
        assert order[node_ids[0]] <= order[node_ids[2]]
        assert group.init_process_group() == ["gloo"] * 4
        assert group.all_reduce(1.0) == [4.0] * 4
        out = group.double(Batch.from_dict({"x": torch.arange(7.0)}))  # padded to 8: 2 rows per rank
        assert out["x2"].tolist() == [0, 2, 4, 6, 8, 10, 12]
        assert out["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3]
        pool.release()
    finally:
        ray.shutdown()
        cluster.shutdown()
