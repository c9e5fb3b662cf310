"""Ctrl-C through the real CLI, as a terminal sends it (SIGINT to the run's whole process group):
the first stops after the step in progress with a checkpoint and prints the command that continues;
a second stops at once; neither shows a traceback. The same command then finishes the run, every
step logged once. (SFT's and async mode's stop and resume: tests/e2e/test_sft_cli.py and
tests/e2e/test_async_cli.py, through the STOP file, the same path in the run skeleton.)"""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, when_checkpointed, when_step_logged
from tests.e2e.test_train_cli import HF_ROLLOUT, TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def interrupted(argv: list[str], run_dir: Path, at_step: int, times: int = 1, delay_s: float = 0.0) -> subprocess.CompletedProcess:
    """``argv`` in a process group of its own, sent SIGINT ``times`` times, ``delay_s`` after ``at_step`` is logged."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"})

    def press() -> None:
        threading.Event().wait(delay_s)
        for _ in range(times):
            os.killpg(process.pid, signal.SIGINT)
            threading.Event().wait(0.3)

    threading.Thread(target=when_step_logged, args=(run_dir, at_step, press), daemon=True).start()
    output, _ = process.communicate(timeout=600)
    return subprocess.CompletedProcess(argv, process.returncode, output, "")


@pytest.mark.own_ray
def test_ctrl_c_stops_after_the_step_a_second_stops_at_once_and_the_same_command_finishes(tmp_path):
    # 24 prompts in batches of 4: 6 steps; a reward that takes 0.25 s a sample (8 a step): a step lasts 2 s
    slow = tmp_path / "slow_reward.py"
    slow.write_text("import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(0.25)\n    return 0.0\n")
    argv = [sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
            f"trainer.default_local_dir={tmp_path}", *TINY_RUN, "data.builtin_options.train_size=24", "trainer.test_freq=-1",
            f"custom_reward_function.path={slow}", HF_ROLLOUT]  # what stops does not depend on the engine
    checkpoint = lambda step: tmp_path / "checkpoints" / f"global_step_{step}"  # noqa: E731

    # one Ctrl-C: the step in progress ends, its checkpoint is written, the command to continue is printed
    stopped = interrupted(argv, tmp_path, at_step=1)
    assert stopped.returncode == 0 and "Traceback" not in stopped.stdout, stopped.stdout[-3000:]
    first = max(r["step"] for r in records(tmp_path))
    assert 1 <= first < 6 and checkpoint(first).is_dir()
    assert f"after step {first} of 6; checkpoint {checkpoint(first)}. To continue: posttrain train" in stopped.stdout

    # the same command resumes; two Ctrl-C inside a step stop at once: that step is not logged, no new checkpoint
    again = interrupted(argv, tmp_path, at_step=first + 1, times=2, delay_s=0.7)
    assert again.returncode == 130 and "Traceback" not in again.stdout, again.stdout[-3000:]
    assert f"resumed from {checkpoint(first)} (step {first})" in again.stdout
    cut = max(r["step"] for r in records(tmp_path))
    assert f"stopped at once (Ctrl-C again) after step {cut} of 6; the last complete checkpoint is {checkpoint(first)}" in again.stdout
    assert "To continue: posttrain train" in again.stdout

    # and again: it continues from the last complete checkpoint to the end, every step logged once
    finished = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert f"resumed from {checkpoint(first)} (step {first})" in finished.stdout
    assert [r["step"] for r in records(tmp_path)] == list(range(7))  # validation at 0, then each step once


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (the CLI's, started with ``start_new_session``: it, its Ray, its workers)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid and Path(entry.path, "stat").read_text().split()[2] != "Z":
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                continue
    return found


@pytest.mark.own_ray
def test_two_ctrl_c_while_the_controller_waits_on_a_worker_stop_at_once_in_one_line_leaving_no_process(tmp_path):
    """The usual place for Ctrl-C: the controller blocked in ``ray.wait`` on a worker's call (here one that
    cannot answer: SIGSTOPped after step 1's checkpoint). The first asks for a stop after the step; the second
    stops at once: one line naming the last checkpoint and the command that continues, exit 130, no
    traceback (it was a SystemError from inside ray.wait), and no process of the run left behind."""
    argv = [sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
            f"trainer.default_local_dir={tmp_path}", *TINY_RUN, "trainer.save_freq=1",  # 8 prompts in batches of 4: 2 steps
            "trainer.val_before_train=false", "trainer.test_freq=-1", HF_ROLLOUT]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"})
    frozen = []

    def freeze_then_press_twice() -> None:
        pid = json.loads((tmp_path / "processes.json").read_text())["actor"][0]
        os.kill(pid, signal.SIGSTOP)  # step 2's first call to the policy never answers: the controller waits in ray.wait
        frozen.append(pid)
        threading.Event().wait(2.0)
        for _ in range(2):  # 1.5 s apart: Ray looks for signals about once a second, and two in one look are one
            os.kill(process.pid, signal.SIGINT)  # to the CLI alone: the frozen worker would not hear it anyway
            threading.Event().wait(1.5)

    threading.Thread(target=when_checkpointed, args=(tmp_path, 1, freeze_then_press_twice), daemon=True).start()
    try:
        output, _ = process.communicate(timeout=300)
        assert frozen, output[-3000:]
        assert process.returncode == 130, output[-3000:]
        assert "Traceback" not in output and "SystemError" not in output, output[-3000:]
        checkpoint = tmp_path / "checkpoints" / "global_step_1"
        stops = [line for line in output.splitlines() if line.startswith("posttrain: stopped")]
        assert stops == [f"posttrain: stopped at once (Ctrl-C again) after step 1 of 2; the last complete checkpoint is "
                         f"{checkpoint}. To continue: {shlex.join(['posttrain', *argv[3:]])}"], output[-3000:]
        deadline = time.monotonic() + 30
        while session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert session_processes(process.pid) == []  # the CLI, its Ray and its workers (the frozen one too) are gone
    finally:
        for pid in frozen + session_processes(process.pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
