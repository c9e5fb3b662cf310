"""``trainer.mode=async`` through the real CLI on the tiny model (vLLM on CPU, local Ray): a
generator beside the trainer, versioned weights through the object store, the staleness bound on
every trained sample (across a graceful stop and its resume), generation overlapping learning, and
the first update of ``max_staleness=0`` equal to sync mode's (both with the HF rollout). Its runs
surviving killed processes (a generator, the trainer, the search agent's retriever and weight board):
tests/e2e/test_async_restarts.py."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import records, run, when_step_logged
from tests.e2e.test_train_cli import HF_ROLLOUT, TINY_RUN, validation_rows

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


def test_async_stopped_gracefully_resumes_within_the_bound_and_trains_every_prompt_once(tmp_path):
    # 6 steps over 3 epochs (8 prompts in batches of 4), validated at steps 0, 2, 4 and 6; stopped from outside
    # (the STOP file) once step 3 is logged, then the same command, with a looser staleness bound, finishes it
    # HF generate: the stop, the buffer and the bounds do not depend on the engine (async on vLLM, weights
    # synced into it: tests/e2e/test_dapo_cli.py and the doctor's async run); each vLLM start costs ~8 CPU s more
    schedule = ["trainer.total_training_steps=6", "trainer.total_epochs=3", "trainer.test_freq=2", HF_ROLLOUT]
    stopped = run(command(tmp_path, *schedule, "async.max_staleness=1"),
                  while_running=lambda: when_step_logged(tmp_path, 3, lambda: (tmp_path / "STOP").touch()))
    assert stopped.returncode == 0, stopped.stdout[-4000:]
    stop_step = int((tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert 3 <= stop_step < 6
    assert f"STOP exists) after step {stop_step} of 6; checkpoint {tmp_path / 'checkpoints' / f'global_step_{stop_step}'}. " \
           "To continue: posttrain train" in stopped.stdout
    first = records(tmp_path)
    assert [r["step"] for r in first] == list(range(stop_step + 1))
    staleness_within(first, 1)
    for record in first[1:]:
        for name in ("actor/pg_loss", "actor/behaviour_weight_mean", "async/trainer_wait_fraction", "async/generated_samples_per_s",
                     "async/trained_samples_per_s", "async/generator_idle_fraction", "timing_s/update_actor",
                     "memory/policy/rss_gb", "memory/generator/rss_gb"):
            assert math.isfinite(record["metrics"][name]), name
        assert record["metrics"]["async/version"] == record["step"]
    for step in (0, 2):  # validation on the trainer's engine: its metrics are those of the 4 episodes it wrote
        rows = validation_rows(tmp_path / "validation" / f"step_{step}.jsonl")
        assert first[step]["metrics"]["val/arithmetic/acc/mean@1"] == sum(row["success"] for row in rows) / 4
        assert first[step]["metrics"]["val/reward/samples"] == 4
    # the stop's checkpoint (save_freq unset) keeps the buffer: every prompt read is trained or kept
    state = torch.load(tmp_path / "checkpoints" / f"global_step_{stop_step}" / "async_state.pt", weights_only=False)
    pending_prompts = sum(len(u.prompts) for u in state["unstarted"]) + sum(len(u.prompts) for u, _ in state["finished"])
    assert state["next_batch"] * 4 == stop_step * 4 + pending_prompts
    resumed = run(command(tmp_path, *schedule, "async.max_staleness=2"))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"resumed from {tmp_path / 'checkpoints' / f'global_step_{stop_step}'}" in resumed.stdout
    steps = [r["step"] for r in records(tmp_path)]
    assert steps[-1] == 6 and sorted(set(steps)) == list(range(7))
    staleness_within(records(tmp_path), 2)
    assert all(r["metrics"]["async/version"] == r["step"] for r in records(tmp_path)[1:])
    assert (tmp_path / "checkpoints" / "global_step_6" / "async_state.pt").exists()  # the final checkpoint, save_freq unset
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


def test_staleness_zero_gives_sync_modes_first_update(tmp_path):
    one_step = ["trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1", HF_ROLLOUT]
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
