"""Resource pools: Ray placement groups that worker groups are placed into.

A pool is a list of nodes, each with a number of bundles; one bundle hosts one worker process (which
may host several colocated roles). Bundles are CPU-only here and carry GPUs on GPU nodes; when
``max_colocate > 1`` several separately spawned worker groups share each bundle, each taking that
fraction of its CPUs/GPUs. Each of a pool's nodes is a different Ray node (a later node's bundles
are asked for with a label selector that excludes the nodes already taken, and where the pool was
placed is checked after), so ``trainer.nnodes=2`` spreads the ranks over two machines even when one
could hold them all. Ranks are assigned in node order (address, then node name), so the same cluster
gives the same ranks after a restart.

Asking never hangs: a node's share that no node of the cluster could ever hold, or more nodes than
the cluster has that could, is refused at once, and one that does not become free within
``ready_timeout_s`` is refused then; the messages set what was asked against what the nodes have.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from posttrain.errors import PosttrainError

TIMEOUT_S = 60.0
NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id


class ResourceError(PosttrainError):
    """The cluster cannot hold what a pool asks for."""

    exit_code = 2


@dataclass(frozen=True)
class Placement:
    """Where one rank goes: a placement group and a bundle index in it."""

    placement_group: object
    bundle_index: int
    node_id: str


@dataclass
class ResourcePool:
    name: str
    bundles_per_node: list[int]
    cpus_per_bundle: float = 1.0
    gpus_per_bundle: float = 0.0
    max_colocate: int = 1
    ready_timeout_s: float = TIMEOUT_S  # how long the bundles may take to become free
    sized_by: str = ""  # the settings that size it, for messages (e.g. "async.num_generators=2 × async.generator_cpus=0.5")
    _placements: list[Placement] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.bundles_per_node or any(n < 1 for n in self.bundles_per_node):
            raise ValueError(f"pool {self.name!r}: bundles_per_node must list positive counts, got {self.bundles_per_node}")

    @property
    def world_size(self) -> int:
        return sum(self.bundles_per_node)

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_bundle > 0

    def share(self) -> tuple[float, float]:
        """(cpus, gpus) one worker process takes from its bundle."""
        return self.cpus_per_bundle / self.max_colocate, self.gpus_per_bundle / self.max_colocate

    def placements(self) -> list[Placement]:
        """Create the placement groups (once) and return one placement per rank, in rank order."""
        if not self._placements:
            self._placements = self._create()
        return self._placements

    def _create(self) -> list[Placement]:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        bundle = {"CPU": self.cpus_per_bundle} | ({"GPU": self.gpus_per_bundle} if self.use_gpu else {})
        self._check_nodes(bundle)
        deadline = time.monotonic() + self.ready_timeout_s
        groups, taken = [], []  # one placement group per pool node, and the Ray node it landed on
        try:
            for i, count in enumerate(self.bundles_per_node):
                # one node at a time: the next one's bundles must avoid the nodes the earlier ones took
                elsewhere = {"bundle_label_selector": [{NODE_LABEL: f"!in({','.join(taken)})"}] * count} if taken else {}
                try:
                    groups.append(placement_group([dict(bundle) for _ in range(count)], strategy="STRICT_PACK", name=f"{self.name}_{i}", **elsewhere))
                except TypeError:  # a Ray from before placement-group label selectors
                    raise ResourceError(self._older_ray_text()) from None
                ready, _ = ray.wait([groups[-1].ready()], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise ResourceError(
                        f"resource pool {self.name!r} asks for {len(self.bundles_per_node)} node(s) with bundles {self.bundles_per_node} of {bundle}; "
                        f"after {self.ready_timeout_s:g} s the cluster has {_amounts(ray.available_resources())} free "
                        f"(nodes: {_nodes_text()}), held by other pools or jobs. Lower trainer.nnodes / "
                        "trainer.n_workers_per_node, free the cluster, or add nodes."
                    )
                taken.append(placement_group_table(groups[-1])["bundles_to_node_id"][0])
            if len(set(taken)) < len(taken):  # a Ray that ignores the label selectors
                raise ResourceError(self._older_ray_text())
        except BaseException:
            for g in groups:
                ray.util.remove_placement_group(g)
            raise
        order = _node_order()
        placements = []
        for g in groups:
            node_of_bundle = placement_group_table(g)["bundles_to_node_id"]
            placements += [Placement(g, i, node_of_bundle[i]) for i in range(g.bundle_count)]
        return sorted(placements, key=lambda p: (order.get(p.node_id, ("~", "")), p.node_id, p.bundle_index))

    def _older_ray_text(self) -> str:
        import ray

        return (
            f"resource pool {self.name!r} needs {len(self.bundles_per_node)} different nodes, and Ray {ray.__version__} cannot keep "
            "a placement group off a node (placement-group label selectors): upgrade Ray on every node "
            "(pip install -U 'ray[default]'), or set trainer.cpus_per_worker so that one node's share fills a node."
        )

    def _check_nodes(self, bundle: dict[str, float]) -> None:
        """The largest node's share (its bundles, STRICT_PACK on one node) must fit as many different
        nodes as the pool has."""
        import ray

        count = max(self.bundles_per_node)
        share = {name: amount * count for name, amount in bundle.items()}
        fitting = sum(all(node["Resources"].get(name, 0) >= amount for name, amount in share.items()) for node in ray.nodes() if node["Alive"])
        if not fitting:
            raise ResourceError(
                f"resource pool {self.name!r} needs {_amounts(share)} on one node ({count} bundle(s) of {_amounts(bundle)}), "
                f"and no node has that: {_nodes_text()}. Lower trainer.n_workers_per_node or trainer.cpus_per_worker, "
                "or use trainer.device=cpu on nodes without GPUs."
            )
        if fitting < len(self.bundles_per_node):
            raise ResourceError(
                f"resource pool {self.name!r} needs {len(self.bundles_per_node)} different nodes with {_amounts(share)} each, "
                f"and the cluster has {fitting} such node(s): {_nodes_text()}. Start the missing nodes "
                "(ray start --address=<head address>:6379 on each) or lower trainer.nnodes."
            )

    def release(self) -> None:
        import ray

        for g in {id(p.placement_group): p.placement_group for p in self._placements}.values():
            ray.util.remove_placement_group(g)
        self._placements = []


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{resources.get(name, 0):g} {name}" for name in ("CPU", "GPU"))


def _nodes_text() -> str:
    import ray

    return "; ".join(f"{n['NodeManagerAddress']}: {_amounts(n['Resources'])}" for n in ray.nodes() if n["Alive"])


def _node_order() -> dict[str, tuple[str, str]]:
    import ray

    return {n["NodeID"]: (n["NodeManagerAddress"], n.get("NodeName", "")) for n in ray.nodes() if n["Alive"]}


@dataclass
class ResourcePoolManager:
    """Which pool each role runs in. Roles that share a pool are colocated in one process per rank."""

    pools: Mapping[str, ResourcePool]
    role_to_pool: Mapping[str, str]

    def __post_init__(self) -> None:
        unknown = {role: pool for role, pool in self.role_to_pool.items() if pool not in self.pools}
        if unknown:
            raise ValueError(f"roles mapped to undefined pools: {unknown}; defined pools: {sorted(self.pools)}")

    def pool_of(self, role: str) -> ResourcePool:
        if role not in self.role_to_pool:
            raise KeyError(f"role {role!r} has no pool; mapped roles: {sorted(self.role_to_pool)}")
        return self.pools[self.role_to_pool[role]]

    def roles_by_pool(self) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for role, pool in self.role_to_pool.items():
            grouped.setdefault(pool, []).append(role)
        return grouped

    def check_cluster(self) -> None:
        """Fail before any worker starts if the cluster cannot hold every pool at once; the message
        lists what each pool asks for."""
        import ray

        need_cpu = sum(p.cpus_per_bundle * p.world_size for p in self.pools.values())
        need_gpu = sum(p.gpus_per_bundle * p.world_size for p in self.pools.values())
        have = ray.cluster_resources()
        if need_cpu > have.get("CPU", 0) or need_gpu > have.get("GPU", 0):
            asks = "; ".join(dict.fromkeys(
                f"{p.sized_by or name}: {p.world_size} × ({p.cpus_per_bundle:g} CPU" + (f", {p.gpus_per_bundle:g} GPU)" if p.gpus_per_bundle else ")")
                for name, p in self.pools.items()
            ))
            raise ResourceError(
                f"the resource pools need {need_cpu:g} CPU and {need_gpu:g} GPU in all ({asks}); the cluster has "
                f"{have.get('CPU', 0):g} CPU and {have.get('GPU', 0):g} GPU. Use fewer or smaller processes (fewer generators, "
                "or a fraction of a CPU/GPU each: async.generator_cpus=0.5; fewer trainer.n_workers_per_node; a smaller env.llm.cpus), "
                "colocate roles, or join a bigger cluster (trainer.ray_address)"
            )
