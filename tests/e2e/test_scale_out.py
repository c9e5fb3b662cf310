"""Scaling out on Ray through the real CLI: ``posttrain train trainer.ray_address=auto trainer.nnodes=2
trainer.n_workers_per_node=1`` on a running two-node cluster (two raylets on this machine, as
``ray start --head`` and ``ray start --address=...`` on two machines make one) trains with one policy
rank on each node, checkpoints, and the same command with more steps resumes from the checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.test_train_cli import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def train_on(address: str, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The CLI as a user on the head node runs it: RAY_ADDRESS names the cluster, ``auto`` joins it."""
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, "actor_rollout_ref.rollout.name=hf",
        "trainer.ray_address=auto", "trainer.nnodes=2", "trainer.n_workers_per_node=1", "trainer.cpus_per_worker=1",
        "trainer.total_epochs=2", "trainer.save_freq=1", *overrides,
    ]
    env = os.environ | {"RAY_ADDRESS": address, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)
@pytest.mark.own_ray
def test_two_nodes_train_one_rank_each_and_resume(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        # The head could hold both ranks (4 CPUs, 1 per rank): only the placement puts one on each node.
        head = cluster.add_node(num_cpus=4)
        other = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes(timeout=60)
        run_dir = tmp_path / "run"  # a path every node reaches (one machine here; a shared filesystem on many)

        train_on(cluster.address, run_dir, "trainer.total_training_steps=2")
        assert steps_logged(run_dir)[-2:] == [1, 2]
        processes = json.loads((run_dir / "processes.json").read_text())
        assert len(processes["actor"]) == 2
        assert sorted(processes["actor_nodes"]) == sorted([head.node_id, other.node_id])
        checkpoints = run_dir / "checkpoints"
        assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "2"
        # rank 0 wrote the weights, each rank its random state
        step_2 = checkpoints / "global_step_2" / "actor"
        assert (step_2 / "model.pt").is_file()
        assert sorted(p.name for p in (step_2 / "rng").iterdir()) == ["rank_0.pt", "rank_1.pt"]

        resumed = train_on(cluster.address, run_dir, "trainer.total_training_steps=3", "trainer.resume_mode=auto")
        assert f"resumed from {checkpoints}/global_step_2 (step 2)" in resumed.stdout
        steps = steps_logged(run_dir)
        assert steps[-3:] == [1, 2, 3] and len(steps) == len(set(steps))  # step 3 added, 1 and 2 not trained again
        assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "3"
        assert sorted(json.loads((run_dir / "processes.json").read_text())["actor_nodes"]) == sorted([head.node_id, other.node_id])
    finally:
        cluster.shutdown()
