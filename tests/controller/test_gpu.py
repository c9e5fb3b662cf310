"""GPU paths of the controller: GPU bundles, NCCL process groups, fractional sharing of one GPU.

Skipped without CUDA. On a machine with one GPU, NCCL runs with one rank (NCCL refuses two ranks on
one device); two groups share that GPU through fractional bundles.
"""

import pytest
import torch

from posttrain.controller import ResourcePool, WorkerSpec, spawn_ray
from tests.controller.workers import Counter, Doubler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.fixture
def ray_gpu():
    import ray

    from tests.conftest import start_local_ray

    ray.shutdown()
    start_local_ray(num_cpus=4, num_gpus=torch.cuda.device_count())
    yield ray
    ray.shutdown()


def test_nccl_process_group_on_a_gpu_bundle(ray_gpu):
    ranks = torch.cuda.device_count()
    pool = ResourcePool("gpu", [ranks], cpus_per_bundle=1, gpus_per_bundle=1)
    group = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
    assert group.init_process_group() == ["nccl"] * ranks
    assert group.all_reduce_on_device(2.0) == [(2.0 * ranks, "cuda")] * ranks
    assert all(len(g) == 1 for g in group.visible_gpus())
    pool.release()


def test_two_groups_share_one_gpu_through_fractional_bundles(ray_gpu):
    pool = ResourcePool("shared_gpu", [1], cpus_per_bundle=2, gpus_per_bundle=1, max_colocate=2)
    first = spawn_ray({"doubler": WorkerSpec(Doubler)}, pool)["doubler"]
    second = spawn_ray({"counter": WorkerSpec(Counter)}, pool)["counter"]
    assert first.pid() != second.pid()  # two processes on the same bundle, half a GPU each
    assert first.visible_gpus() == [["0"]]
    pool.release()
