"""Ctrl-C through the real CLI, as a terminal sends it (SIGINT to the run's whole process group):
the first stops after the step in progress with a checkpoint and prints the command that continues;
a second stops at once; neither shows a traceback. The same command then finishes the run, every
step logged once. Sync training and SFT (async mode's stop: tests/e2e/test_async_cli.py)."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, when_step_logged
from tests.e2e.test_sft_cli import TINY_DATA
from tests.e2e.test_train_cli import TINY_RUN

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


def train_command(run_dir: Path) -> list[str]:
    # 40 prompts in batches of 4: 10 steps
    return [sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
            f"trainer.default_local_dir={run_dir}", *TINY_RUN, "data.builtin_options.train_size=40", "trainer.test_freq=5"]


def test_ctrl_c_stops_sync_training_after_the_step_with_a_checkpoint_and_the_same_command_continues(tmp_path):
    argv = train_command(tmp_path)
    stopped = interrupted(argv, tmp_path, at_step=2)
    assert stopped.returncode == 0, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout, stopped.stdout[-3000:]
    step = max(r["step"] for r in records(tmp_path))
    assert 2 <= step < 10
    checkpoint = tmp_path / "checkpoints" / f"global_step_{step}"
    assert checkpoint.is_dir()
    assert f"after step {step} of 10; checkpoint {checkpoint}. To continue: posttrain train" in stopped.stdout

    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from {checkpoint} (step {step})" in resumed.stdout
    assert [r["step"] for r in records(tmp_path)] == list(range(11))  # validation at 0, then each step once


def test_a_second_ctrl_c_stops_at_once_naming_the_last_checkpoint(tmp_path):
    # a reward that takes 0.5 s a sample (8 a step, 4 s): both presses land inside step 3
    slow = tmp_path / "slow_reward.py"
    slow.write_text("import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(0.5)\n    return 0.0\n")
    argv = train_command(tmp_path) + ["trainer.save_freq=1", f"custom_reward_function.path={slow}", "trainer.val_before_train=false",
                                      "trainer.test_freq=-1"]
    stopped = interrupted(argv, tmp_path, at_step=2, times=2, delay_s=1.5)
    assert stopped.returncode == 130, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout, stopped.stdout[-3000:]
    assert "stopped at once (Ctrl-C again)" in stopped.stdout
    step = max(r["step"] for r in records(tmp_path))
    assert step == 2  # step 3 was cut short: nothing of it is logged
    assert f"after step {step} of 10; the last complete checkpoint is {tmp_path / 'checkpoints' / f'global_step_{step}'}" in stopped.stdout
    assert "To continue: posttrain train" in stopped.stdout


def test_ctrl_c_stops_sft_with_a_checkpoint_and_the_same_command_finishes_it(tmp_path):
    model = cached_tiny_model("llama")
    argv = [sys.executable, "-m", "posttrain.cli", "sft", "--preset", "search_sft", f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={tmp_path}", *TINY_DATA, "data.builtin_options.train_size=40", "data.builtin_options.sft_size=16",
            "sft.train_batch_size=2",
            "sft.micro_batch_size_per_gpu=2", "sft.total_training_steps=8", "sft.optim.warmup_steps=0", "sft.val_rollout=false"]
    stopped = interrupted(argv, tmp_path, at_step=2)
    assert stopped.returncode == 0, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout, stopped.stdout[-3000:]
    step = max(r["step"] for r in records(tmp_path))
    assert f"after step {step} of 8; checkpoint {tmp_path / 'checkpoints' / f'global_step_{step}'}. To continue: posttrain sft" in stopped.stdout
    assert not (tmp_path / "export").exists()  # the export is the finished run's

    finished = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert [r["step"] for r in records(tmp_path)] == list(range(9))
    assert (tmp_path / "export" / "config.json").is_file()
