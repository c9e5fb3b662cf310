"""Runs that fail, fail cleanly, through the real CLI on the tiny model (HF rollout, local Ray): a
policy worker killed from outside mid-step, with restarts off, stops the run within seconds with one
line naming the dead rank, its log file and the checkpoint that resumes the run, and the same command
then finishes it; a policy worker frozen mid-step (alive, never answering) is found at the call
deadline, named (role, rank, method), killed, and the run restarted from its checkpoint finishes."""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, run, when_checkpointed
from tests.e2e.test_train_cli import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def command(run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, "actor_rollout_ref.rollout.name=hf", *overrides,
    ]


def test_a_policy_worker_killed_mid_step_stops_the_run_in_seconds_and_the_same_command_finishes_it(tmp_path):
    steps = ["trainer.total_training_steps=3", "trainer.total_epochs=2", "trainer.save_freq=1",
             "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.max_restarts=0"]  # stop, not restart
    killed_at = []

    def kill_policy():  # step 1 is checkpointed: the policy worker is in step 2
        pid = json.loads((tmp_path / "processes.json").read_text())["actor"][0]
        killed_at.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    died = run(command(tmp_path, *steps), while_running=lambda: when_checkpointed(tmp_path, 1, kill_policy))
    assert killed_at and time.monotonic() - killed_at[0] < 10, died.stdout[-3000:]  # the whole CLI has exited
    assert died.returncode == 1, died.stdout[-3000:]
    assert "Traceback" not in died.stdout
    errors = [line for line in died.stdout.splitlines() if line.startswith("posttrain: worker")]
    assert len(errors) == 1, died.stdout[-3000:]
    latest = tmp_path / "checkpoints" / f"global_step_{(tmp_path / 'checkpoints' / 'latest_checkpointed_iteration.txt').read_text()}"
    assert re.search(r"posttrain: worker 'actor' rank 0 died during \w+\(\)", errors[0])
    assert f"The run stopped in step 2; resume from {latest} with trainer.resume_mode=auto" in errors[0]
    log = re.search(r"stderr in (\S+\.err)", errors[0])
    assert log and Path(log.group(1)).is_file()  # the killed process's own log file
    kept = (tmp_path / "posttrain.log").read_text()
    assert "Traceback" in kept and "WorkerDiedError" in kept  # the traceback the console was spared

    resumed = run(command(tmp_path, *steps))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resumed from {latest}" in resumed.stdout
    assert [r["step"] for r in records(tmp_path)][-2:] == [2, 3]


def test_a_frozen_policy_worker_is_restarted_at_the_call_deadline_naming_what_it_was_doing(tmp_path):
    """A call past trainer.call_timeout_s is a hung worker: the run kills it, starts the workers again
    from the last checkpoint (trainer.max_restarts, 2 by default with save_freq set) and finishes."""
    steps = ["trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
             "trainer.call_timeout_s=30"]
    frozen = []

    def freeze_policy():  # step 1 is checkpointed; SIGSTOP: the process lives on but never answers, as in a deadlock
        pid = json.loads((tmp_path / "processes.json").read_text())["actor"][0]
        frozen.append((pid, time.monotonic()))
        os.kill(pid, signal.SIGSTOP)

    hung = run(command(tmp_path, *steps), while_running=lambda: when_checkpointed(tmp_path, 1, freeze_policy))
    assert frozen, hung.stdout[-3000:]
    assert hung.returncode == 0, hung.stdout[-3000:]
    assert "Traceback" not in hung.stdout
    restarts = [line for line in hung.stdout.splitlines() if line.startswith("posttrain: restart")]
    assert len(restarts) == 1, hung.stdout[-3000:]
    assert re.search(r"posttrain: restart 1 of 2 \(trainer.max_restarts\): worker 'actor' rank\(s\) \[0\] did not answer \w+\(\) "
                     r"within 30 s", restarts[0])
    assert f"rank 0: pid {frozen[0][0]}" in restarts[0]
    assert restarts[0].endswith(f"Starting the workers again, from {tmp_path / 'checkpoints' / 'global_step_1'}.")
    assert "WorkerHungError" in (tmp_path / "posttrain.log").read_text()
    assert [r["step"] for r in records(tmp_path)] == [1, 2] and records(tmp_path)[-1]["metrics"]["run/restarts"] == 1
    assert not _alive(frozen[0][0])  # the stuck process was killed with its attempt, not left behind


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
