"""``trainer.mode=async`` surviving its processes killed, through the real CLI on the tiny model (the
HF rollout: what is killed and restarted does not depend on the engine; local Ray): a killed generator
replaced (the collective transport), the trainer killed and the run restarted from its checkpoint with
its buffer and then its new generator killed (the object store), and the search agent's retriever and
weight board killed. Apart from tests/e2e/test_async_cli.py so that the two test processes
(``--dist loadfile``) can run them side by side."""

import json
import math
import os
import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import kill_descendant, records, run, when, when_checkpointed, when_step_logged
from tests.e2e.test_async_cli import command, staleness_within, trained_prompts
from tests.e2e.test_search_agent import TINY_SEARCH_RUN
from tests.e2e.test_train_cli import HF_ROLLOUT

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def kill_generator(run_dir: Path) -> None:
    os.kill(json.loads((run_dir / "processes.json").read_text())["generator_0"], signal.SIGKILL)


def test_a_killed_generator_is_replaced_and_the_run_finishes(tmp_path):
    """The collective transport: the group is formed again and the current version broadcast (here
    through the group's store). The object store's replacement, which pulls the weights, is killed in
    the resumed run of the killed-trainer test below."""
    done = run(command(tmp_path, "trainer.total_training_steps=4", "trainer.total_epochs=2", "async.max_staleness=1",
                       "trainer.val_before_train=false", "trainer.test_freq=-1", "async.weight_transport=collective", HF_ROLLOUT),
               while_running=lambda: when_step_logged(tmp_path, 1, lambda: kill_generator(tmp_path)))
    assert done.returncode == 0, done.stdout[-4000:]
    assert "generator 0 died" in done.stdout
    last = records(tmp_path)[-1]
    assert last["step"] == 4 and last["metrics"]["async/generator_restarts"] >= 1
    staleness_within(records(tmp_path), 1)



def _serves_a_retriever(process: psutil.Process) -> bool:
    try:
        return "serve-retriever" in " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile, or not ours to read
        return False


@pytest.mark.own_ray  # the weight board must be a process of this run (below its CLI), not of the shared cluster
def test_async_search_agent_survives_its_retriever_and_its_weight_board_killed(tmp_path):
    """The retriever the run started, SIGKILLed once step 1 is checkpointed: the run restarts from its
    last checkpoint with a new retriever (the units generated before the kill may finish a step first);
    then the weight board (the Ray actor that names the newest weights to the generators), SIGKILLed
    once the restarted attempt has logged a step: the run restarts again. Each of the 6 steps is
    logged once."""
    argv = [
        sys.executable, "-m", "posttrain.cli", "train", "--preset", "search_grpo",
        f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path}",
        f"data.builtin_options.seed={os.getpid()}", *TINY_SEARCH_RUN, "trainer.mode=async", "async.partial_rollout=resume",
        "trainer.val_before_train=false", "async.unit_groups=2",  # two generator calls per batch, joined by the trainer
        "trainer.total_training_steps=6", "trainer.total_epochs=3", "trainer.save_freq=1", "trainer.test_freq=-1", HF_ROLLOUT,
    ]
    killed: list[int] = []

    def restarted_attempt_logged_a_step() -> bool:
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        return bool(lines) and json.loads(lines[-1])["metrics"].get("run/restarts") == 1

    run_marker = f"trainer.default_local_dir={tmp_path}"

    def kills():
        when_checkpointed(tmp_path, 1, lambda: killed.append(kill_descendant("posttrain.cli serve-retriever", run_marker)))
        when(restarted_attempt_logged_a_step, lambda: killed.append(kill_descendant("ray::WeightBoard", run_marker)))

    done = run(argv, while_running=kills)
    assert done.returncode == 0, done.stdout[-4000:]
    assert len(killed) == 2, done.stdout[-4000:]
    assert "retriever (bm25) over" in done.stdout  # one service for the run, reached by the generator by URL
    restarts = [line for line in done.stdout.splitlines() if line.startswith("posttrain: restart")]
    assert len(restarts) == 2, done.stdout[-4000:]
    assert "the retriever the run started" in restarts[0] and "exited with code -9" in restarts[0], restarts[0]
    # the generator's call to the dead board failed: the generator is not replaced (it did not die), the run restarts
    assert "generator 0 failed" in restarts[1] and "RayTaskError(ActorDiedError)" in restarts[1], restarts[1]
    found = records(tmp_path)
    assert [r["step"] for r in found] == [1, 2, 3, 4, 5, 6]
    restarted = [r["metrics"]["run/restarts"] for r in found]
    assert restarted[0] == 0 and restarted[-1] == 2 and restarted == sorted(restarted), restarted
    for record in found:
        metrics = record["metrics"]
        for name in ("num_turns/mean", "agent/valid_action_ratio", "actor/pg_loss", "async/trainer_wait_fraction"):
            assert math.isfinite(metrics[name]), name
        assert 1 <= metrics["num_turns/max"] <= 3
    staleness_within(found, 1)
    # every retriever this run started (one per attempt) is stopped: none of their ports is served by a live process
    # (a process of another test may serve a corpus too; a run's orphan would no longer be below this process)
    ports = re.findall(r"retriever \(bm25\) over .* at http://127\.0\.0\.1:(\d+)", done.stdout)
    assert len(ports) == 3, done.stdout[-4000:]
    live = [" ".join(p.cmdline()) for p in psutil.process_iter() if _serves_a_retriever(p)]
    assert not [line for line in live for port in ports if f"--port {port}" in line], live



def test_a_killed_trainer_is_restarted_and_a_killed_generator_replaced_and_no_prompt_is_trained_twice_or_lost(tmp_path):
    """The trainer's process killed after step 2: the run tears down everything (generators too),
    starts again from the last checkpoint with its buffer (trainer.max_restarts) and, when the new
    generator is killed as well, replaces it without restarting the trainer. Across both, the prompts
    trained at each step (trained_prompts.jsonl, "<epoch>:<row>") are each trained once: none twice,
    none of the epochs the run went through skipped."""
    def kill_trainer():
        os.kill(json.loads((tmp_path / "processes.json").read_text())["trainer"][0], signal.SIGKILL)

    # 5 steps: the restarted attempt has at least two, so its generator can die after the first
    steps = ["trainer.total_training_steps=5", "trainer.total_epochs=3", "trainer.save_freq=1", "trainer.val_before_train=false",
             "trainer.test_freq=-1", HF_ROLLOUT]
    killed_generator = []

    def restarted_attempt_logged_a_step() -> bool:
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        return bool(lines) and json.loads(lines[-1])["metrics"].get("run/restarts") == 1

    def after_restart_kill_generator():
        when(restarted_attempt_logged_a_step, lambda: killed_generator.append(kill_generator(tmp_path)))

    def kills():
        when_step_logged(tmp_path, 2, kill_trainer)
        after_restart_kill_generator()

    done = run(command(tmp_path, *steps), while_running=kills)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "posttrain: restart 1 of 2 (trainer.max_restarts): worker 'actor' rank 0 died" in done.stdout
    assert killed_generator and "generator 0 died" in done.stdout  # replaced, the trainer not restarted again
    assert "restart 2 of 2" not in done.stdout and "Traceback" not in done.stdout
    last = records(tmp_path)[-1]
    assert last["step"] == 5 and last["metrics"]["run/restarts"] == 1 and last["metrics"]["async/generator_restarts"] >= 1
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3, 4, 5]
    staleness_within(records(tmp_path), 1)
    ids = [uid for prompts in trained_prompts(tmp_path) for uid in prompts]
    assert len(ids) == 20 and len(set(ids)) == 20, ids  # none twice
    assert {f"{epoch}:{row}" for epoch in (0, 1) for row in range(8)} <= set(ids)  # none of two whole epochs lost
