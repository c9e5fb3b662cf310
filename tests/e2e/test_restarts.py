"""Runs that survive, through the real CLI on the tiny model (HF rollout, the tests' Ray cluster):
a policy worker killed during generation, the update, the weight sync and a checkpoint save, one
after the other in one run (``trainer.max_restarts``), and the controller itself killed and the
same command run again; each run ends with exit 0 and with every step's metrics and prompts equal
to an uninterrupted run's at the same seed, each step recorded once."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.controller.faults import FAULT_DIR, KILL_AT
from posttrain.models import cached_tiny_model
from posttrain.trainer.run import TRAINED_PROMPTS
from scripts.compare_metrics import differences
from tests.e2e.cli_runs import records, run, when
from tests.e2e.test_resume import VOWEL_REWARD
from tests.e2e.test_train_cli import DEFAULT_SKIP, TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# 8 prompts in batches of 4 over 3 epochs: 5 steps; a checkpoint after each; no validation, so that
# a worker's n-th call of a method is the n-th step's
STEPS = ["trainer.total_training_steps=5", "trainer.total_epochs=3", "trainer.save_freq=1", "trainer.val_before_train=false",
         "trainer.test_freq=-1"]
# Each fault fires once (its marker is written first), and a restarted worker counts its calls from
# 1 again, so in turn: step 2's generation, step 3's update, step 4's weight sync, step 5's save.
FAULTS = "actor.generate@2 actor.update@2 actor.sync_weights@2 actor.save_checkpoint@2"


def command(run_dir: Path, *overrides: str) -> list[str]:
    reward = run_dir.parent / "vowels.py"  # rewards that differ between responses: every step moves the weights
    reward.write_text(VOWEL_REWARD)
    return [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, DEFAULT_SKIP, "actor_rollout_ref.rollout.name=hf", f"custom_reward_function.path={reward}",
        *STEPS, *overrides,
    ]


def prompts_by_step(run_dir: Path) -> list[tuple[int, list[str]]]:
    return [(r["step"], r["prompts"]) for r in map(json.loads, (run_dir / TRAINED_PROMPTS).read_text().splitlines())]


def assert_equal_runs(run_dir: Path, reference: Path) -> None:
    steps = [r["step"] for r in records(run_dir)]
    assert steps == [1, 2, 3, 4, 5], steps  # each step once
    compared, different = differences(records(reference), records(run_dir))
    assert compared > 100 and not different, different
    assert prompts_by_step(run_dir) == prompts_by_step(reference)


def test_a_worker_killed_in_each_phase_is_restarted_and_the_run_equals_an_uninterrupted_one(tmp_path):
    reference = tmp_path / "reference"
    done = subprocess.run(command(reference), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = prompts_by_step(reference)
    ids = [p for _, prompts in trained for p in prompts]
    assert len(ids) == len(set(ids)) == 20 and {f"{e}:{row}" for e in (0, 1) for row in range(8)} <= set(ids)
    assert all(r["metrics"]["run/restarts"] == 0 for r in records(reference))

    killed = tmp_path / "killed"
    faults = tmp_path / "faults"
    faults.mkdir()
    os.environ[KILL_AT], os.environ[FAULT_DIR] = FAULTS, str(faults)
    try:
        survived = run(command(killed, "trainer.max_restarts=4"))
    finally:
        del os.environ[KILL_AT], os.environ[FAULT_DIR]
    assert survived.returncode == 0, survived.stdout[-5000:]
    assert sorted(p.name for p in faults.iterdir()) == sorted(FAULTS.split())  # every fault fired
    restarts = [line for line in survived.stdout.splitlines() if line.startswith("posttrain: restart")]
    assert len(restarts) == 4, survived.stdout[-5000:]
    for line, method, resumed_at in zip(restarts, ("generate", "update", "sync_weights", "save_checkpoint"), (1, 2, 3, 4)):
        assert f"worker 'actor' rank 0 died during {method}()" in line, line
        assert line.endswith(f"Starting the workers again, from {killed / 'checkpoints' / f'global_step_{resumed_at}'}."), line
    assert "Traceback" not in survived.stdout
    assert records(killed)[-1]["metrics"]["run/restarts"] == 4
    assert_equal_runs(killed, reference)
    assert (killed / "posttrain.log").read_text().count("restart ") >= 4  # each with its cause and traceback
    assert "WorkerDiedError" in (killed / "posttrain.log").read_text()

    # the controller itself killed (SIGKILL, nothing cleaned up) once step 2 is checkpointed: the same
    # command resumes from the last complete checkpoint and finishes the same way
    controller = tmp_path / "controller"
    process = subprocess.Popen(command(controller), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pointer = controller / "checkpoints" / "latest_checkpointed_iteration.txt"
    when(lambda: pointer.exists() and int(pointer.read_text() or 0) >= 2, lambda: process.send_signal(signal.SIGKILL))
    assert process.wait(timeout=600) == -signal.SIGKILL  # killed before its last step (3 more were to come)
    again = run(command(controller))
    assert again.returncode == 0, again.stdout[-3000:]
    assert "resumed from" in again.stdout
    assert_equal_runs(controller, reference)


@pytest.mark.own_ray
def test_after_a_restarted_run_and_a_failed_one_no_ray_actor_object_or_child_process_is_left(tmp_path, monkeypatch):
    """The soak bench's checks (bench/soak.py) after a run whose worker was killed and restarted, and
    after one whose kill stopped it (restarts off): no Ray actor alive, no object in the object store,
    and once Ray is shut down no child process of this one."""
    import psutil
    import ray
    from rich.console import Console

    from bench.soak import children_left, ray_leftovers
    from posttrain.config import preset_path
    from posttrain.controller import WorkerDiedError
    from posttrain.cli.preflight import load_run_config
    from posttrain.cli.train import start_ray
    from posttrain.trainer.modes import training_run
    from posttrain.trainer.run import fit_with_restarts

    if ray.is_initialized():  # an earlier test file in this process left its local Ray up (tests/conftest.py's ray_local)
        ray.shutdown()
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. the shared cluster's holder

    def config(name: str, *overrides: str):
        return load_run_config([preset_path("arithmetic_grpo")], [f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path / name}",
                                    *TINY_RUN, "actor_rollout_ref.rollout.name=hf", "trainer.total_training_steps=3", "trainer.total_epochs=2",
                                    "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.test_freq=-1", *overrides])

    monkeypatch.setenv(KILL_AT, "actor.update@2")
    restarted, failed = config("restarted", "trainer.max_restarts=1"), config("failed", "trainer.max_restarts=0")
    start_ray(restarted.trainer, None)
    try:
        monkeypatch.setenv(FAULT_DIR, str(tmp_path / "faults_restarted"))
        (tmp_path / "faults_restarted").mkdir()
        finished = fit_with_restarts(training_run(restarted), lambda stop: training_run(restarted, stop), Console())
        assert finished.restarts == 1 and finished.step == 3
        actors, objects, _ = ray_leftovers(grace_s=15)
        assert (actors, objects) == (0, 0)

        monkeypatch.setenv(FAULT_DIR, str(tmp_path / "faults_failed"))
        (tmp_path / "faults_failed").mkdir()
        with pytest.raises(WorkerDiedError, match="died during update"):
            fit_with_restarts(training_run(failed), lambda stop: training_run(failed, stop), Console())
        actors, objects, _ = ray_leftovers(grace_s=15)
        assert (actors, objects) == (0, 0)
    finally:
        ray.shutdown()
    assert children_left(grace_s=15, ignore=before) == []
