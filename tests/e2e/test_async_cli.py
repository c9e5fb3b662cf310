"""``trainer.mode=async`` through the real CLI on the tiny model (vLLM on CPU, local Ray): a
generator beside the trainer, versioned weights through the object store, the staleness bound on
every trained sample (across a graceful stop and its resume), generation overlapping learning, a
killed generator replaced, the first update of ``max_staleness=0`` equal to sync mode's, and the
search agent with its live retriever."""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import kill_descendant, records, run, when, when_checkpointed, when_step_logged
from tests.e2e.test_search_agent import TINY_SEARCH_RUN
from tests.e2e.test_train_cli import TINY_RUN, validation_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def command(run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, "trainer.mode=async", *overrides,
    ]


def staleness_within(metric_records: list[dict], bound: int) -> None:
    trained = [r for r in metric_records if "async/staleness/max" in r["metrics"]]
    assert trained
    for record in trained:
        metrics = record["metrics"]
        assert 0 <= metrics["async/staleness/max"] <= bound, record["step"]
        assert math.isclose(sum(metrics.get(f"async/staleness/lag_{k}", 0.0) for k in range(bound + 1)), 1.0)


def test_async_two_steps_then_a_graceful_stop_resumes_within_the_bound(tmp_path):
    done = run(command(tmp_path, "trainer.total_training_steps=2", "async.max_staleness=1", "trainer.test_freq=2"))
    assert done.returncode == 0, done.stdout[-4000:]
    first = records(tmp_path)
    assert [r["step"] for r in first] == [0, 1, 2]
    for record in first[1:]:
        for name in ("actor/pg_loss", "actor/behaviour_weight_mean", "async/trainer_wait_fraction", "async/generated_samples_per_s",
                     "async/trained_samples_per_s", "async/generator_idle_fraction", "timing_s/update_actor"):
            assert math.isfinite(record["metrics"][name]), name
        assert record["metrics"]["async/version"] == record["step"]
    for step in (0, 2):  # validation on the trainer's engine: its metrics are those of the 4 episodes it wrote
        rows = validation_rows(tmp_path / "validation" / f"step_{step}.jsonl")
        assert first[step]["metrics"]["val/arithmetic/acc/mean@1"] == sum(row["success"] for row in rows) / 4
        assert first[step]["metrics"]["val/reward/samples"] == 4
    assert (tmp_path / "checkpoints" / "global_step_2" / "async_state.pt").exists()  # the final checkpoint, save_freq unset

    # 6 more steps over 2 epochs, stopped from outside (the STOP file) once step 3 is logged, then resumed
    more = ["trainer.total_training_steps=6", "trainer.total_epochs=3", "async.max_staleness=2"]
    stopped = run(command(tmp_path, *more), while_running=lambda: when_step_logged(tmp_path, 3, lambda: (tmp_path / "STOP").touch()))
    assert stopped.returncode == 0, stopped.stdout[-4000:]
    stop_step = int((tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert 3 <= stop_step < 6
    assert "resumed from" in stopped.stdout
    assert f"STOP exists) after step {stop_step} of 6; checkpoint {tmp_path / 'checkpoints' / f'global_step_{stop_step}'}. " \
           "To continue: posttrain train" in stopped.stdout
    state = torch.load(tmp_path / "checkpoints" / f"global_step_{stop_step}" / "async_state.pt", weights_only=False)
    pending_prompts = sum(len(u.prompts) for u in state["unstarted"]) + sum(len(u.prompts) for u, _ in state["finished"])
    assert state["next_batch"] * 4 == stop_step * 4 + pending_prompts  # every prompt read is trained or kept
    resumed = run(command(tmp_path, *more))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    steps = [r["step"] for r in records(tmp_path)]
    assert steps[-1] == 6 and sorted(set(steps)) == list(range(7))
    staleness_within(records(tmp_path), 2)
    ids = [uid for prompts in trained_prompts(tmp_path) for uid in prompts]  # 6 steps of 4: three whole epochs of 8
    assert sorted(ids) == sorted(f"{epoch}:{row}" for epoch in range(3) for row in range(8))  # across the stop: none twice, none lost

    # generation overlapped learning, the point of async (timeline.jsonl: who worked when, wall-clock);
    # a trainer that generated and then trained in turns would show no generation inside any learning
    timeline = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timeline] == list(range(1, 7))  # each trained step once, across the stop
    learning = [t["learn"] for t in timeline]
    generating = [u["interval"] for t in timeline for u in t["units"]]
    assert all(end > start for start, end in learning + generating)
    overlap_s = sum(max(0.0, min(g[1], l[1]) - max(g[0], l[0])) for g in generating for l in learning)
    assert overlap_s > 0, f"generation {generating} never overlapped learning {learning}"


def kill_generator(run_dir: Path) -> None:
    os.kill(json.loads((run_dir / "processes.json").read_text())["generator_0"], signal.SIGKILL)


def test_a_killed_generator_is_replaced_and_the_run_finishes(tmp_path):
    """The collective transport: the group is formed again and the current version broadcast (here
    through the group's store). The object store's replacement, which pulls the weights, is killed in
    the resumed run of the killed-trainer test below."""
    done = run(command(tmp_path, "trainer.total_training_steps=4", "trainer.total_epochs=2", "async.max_staleness=1",
                       "trainer.val_before_train=false", "trainer.test_freq=-1", "async.weight_transport=collective"),
               while_running=lambda: when_step_logged(tmp_path, 1, lambda: kill_generator(tmp_path)))
    assert done.returncode == 0, done.stdout[-4000:]
    assert "generator 0 died" in done.stdout
    last = records(tmp_path)[-1]
    assert last["step"] == 4 and last["metrics"]["async/generator_restarts"] >= 1
    staleness_within(records(tmp_path), 1)


def test_staleness_zero_gives_sync_modes_first_update(tmp_path):
    one_step = ["trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1"]
    sync = subprocess.run(command(tmp_path / "sync", *one_step, "trainer.mode=sync"), capture_output=True, text=True, timeout=600)
    assert sync.returncode == 0, sync.stdout[-3000:] + sync.stderr[-3000:]
    done = run(command(tmp_path / "async", *one_step, "async.max_staleness=0", "async.correction=none"))
    assert done.returncode == 0, done.stdout[-4000:]
    a, s = records(tmp_path / "async")[-1]["metrics"], records(tmp_path / "sync")[-1]["metrics"]
    assert a["async/staleness/max"] == 0
    for name in ("critic/score/mean", "response_length/mean", "critic/advantages/max"):
        assert a[name] == s[name], name  # the same samples
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert math.isclose(a[name], s[name], rel_tol=1e-4, abs_tol=1e-6), (name, a[name], s[name])


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
        "trainer.total_training_steps=6", "trainer.total_epochs=3", "trainer.save_freq=1", "trainer.test_freq=-1",
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


def test_more_generators_than_the_machine_hosts_is_refused_before_workers_start(tmp_path):
    cpus = os.cpu_count() or 1
    done = subprocess.run(command(tmp_path, f"async.num_generators={cpus + 1}"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"async.num_generators={cpus + 1}" in done.stderr and "fewer generators" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "processes.json").exists()


def trained_prompts(run_dir: Path) -> list[list[str]]:
    lines = [json.loads(line) for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, len(lines) + 1))  # each step once
    return [line["prompts"] for line in lines]


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
             "trainer.test_freq=-1"]
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
