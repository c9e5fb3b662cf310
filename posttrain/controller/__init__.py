"""The Ray single controller: workers, registered methods, worker groups, resource pools."""

from posttrain.controller.decorator import Dispatch, Execute, register
from posttrain.controller.dispatch import GroupFuture
from posttrain.controller.resource_pool import ResourceError, ResourcePool, ResourcePoolManager
from posttrain.controller.worker import MeshInfo, Worker, WorkerContext
from posttrain.controller.worker_group import (
    WorkerDiedError,
    WorkerGroup,
    WorkerHungError,
    WorkerProcess,
    WorkerSpec,
    WorkerStartError,
    kill_group,
    spawn_local,
    spawn_pools,
    spawn_ray,
)

__all__ = [
    "Dispatch", "Execute", "register", "GroupFuture", "ResourceError", "ResourcePool", "ResourcePoolManager",
    "MeshInfo", "Worker", "WorkerContext", "WorkerDiedError", "WorkerGroup", "WorkerHungError",
    "WorkerProcess", "WorkerSpec", "WorkerStartError", "kill_group",
    "spawn_local", "spawn_pools", "spawn_ray",
]
