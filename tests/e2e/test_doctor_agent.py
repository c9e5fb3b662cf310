"""``posttrain train --preset doctor_grpo`` end to end: a tiny doctor, a tiny patient served by the
Env-LLM worker (vLLM; in its own process, killed mid-run and restarted, in sync mode; colocated with
the trainer in async mode), local Ray; then the trained checkpoint against the rule-based patient."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from posttrain.controller.faults import FAULT_DIR, KILL_AT
from posttrain.models import cached_tiny_model
from tests.e2e.cli_runs import episodes

pytestmark = [pytest.mark.slow, pytest.mark.ray]

TINY_DOCTOR_RUN = [
    "data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.sft_size=0",
    "data.train_batch_size=4", "data.max_response_length=96",
    "env.max_turns=2", "env.max_turn_tokens=16", "env.max_obs_length=32",
    "env.llm.max_tokens=8", "env.llm.max_model_len=384", "env.llm.cpu_kv_cache_gb=0.0625",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625",
    "trainer.logger=[console,jsonl]", "trainer.test_freq=2", "trainer.total_training_steps=2",
    "env.llm.min_faithfulness=null",  # the tiny random patient answers at random: the probe's refusal has a test of its own
    "actor_rollout_ref.actor.skip_zero_advantage=false",  # the tiny doctor's groups tie at 0: run them, so the update is exercised
]


def posttrain(*args, timeout=600, env=None):
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_doctor_grpo_two_steps_with_an_env_llm_patient(tmp_path):
    tiny = str(cached_tiny_model("llama"))
    # the doctor's rollout is HF generate (its engine is not the point here: the async test below runs it on vLLM);
    # the patient's Env-LLM worker is vLLM
    models = [f"actor_rollout_ref.model.path={tiny}", f"env.llm.model_path={tiny}", "actor_rollout_ref.rollout.name=hf"]
    # the patient's probe first: the tiny random model contradicts its cases, so RL against it refuses to start
    # (the patient on HF generate here: the verdict, not the engine, is checked; vLLM's patient is the run below)
    refused = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "--preset", "doctor_grpo", *models,
                              f"trainer.default_local_dir={tmp_path / 'refused'}", *TINY_DOCTOR_RUN, "env.llm.min_faithfulness=0.8",
                              "env.llm.rollout=hf"],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert re.search(r"the patient \(\S+\) agrees with its cases on 0\.\d\d of \d+ yes/no findings, below env\.llm\.min_faithfulness=0\.8",
                     refused.stderr), refused.stderr[-2000:]
    assert "posttrain recipe doctor" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "refused" / "metrics.jsonl").exists() or "\"step\": 1" not in (tmp_path / "refused" / "metrics.jsonl").read_text()
    # the patient in a process of its own (env.llm.placement=separate), SIGKILLed as its first reply batch
    # starts (POSTTRAIN_KILL_AT): the probe's, which min_faithfulness=0 runs but never fails (the tiny
    # doctor writes no </question>, so only the probe asks the patient). The run restarts and finishes
    faults = tmp_path / "faults"
    faults.mkdir()
    done = posttrain("train", "--preset", "doctor_grpo", *models, f"trainer.default_local_dir={tmp_path}", *TINY_DOCTOR_RUN,
                     "env.llm.placement=separate", "env.llm.min_faithfulness=0", "trainer.save_freq=1", "trainer.max_restarts=1",
                     "trainer.rollout_data_dir=rollouts",
                     env={KILL_AT: "env_llm.chat@1", FAULT_DIR: str(faults)})
    assert [p.name for p in faults.iterdir()] == ["env_llm.chat@1"], done.stdout[-3000:]  # the fault fired
    restarts = [line for line in done.stdout.splitlines() if line.startswith("posttrain: restart")]
    assert len(restarts) == 1 and "worker 'env_llm' rank 0 died during chat()" in restarts[0], done.stdout[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # each once
    assert records[-1]["metrics"]["run/restarts"] == 1
    for step in (0, 2):  # each validation's accuracy is the fraction of its 4 episodes (4 prompts x 1) that succeeded
        rows = episodes(tmp_path / "validation" / f"step_{step}.jsonl")
        assert len(rows) == 4 and records[step]["metrics"]["val/synthetic_doctor/acc/mean@1"] == sum(r["success"] for r in rows) / 4
    for record in records[1:]:
        metrics = record["metrics"]
        for name in ("num_turns/mean", "agent/success_rate", "env/questions", "env/relevant_question_ratio",
                     "env/patient_refusals", "actor/pg_loss", "timing_s/gen"):
            assert math.isfinite(metrics[name]), name
        # the step's metrics are those of the episodes it wrote (trainer.rollout_data_dir): 4 prompts x 2 samples
        rows = episodes(tmp_path / "rollouts" / f"step_{record['step']}.jsonl")
        turns = [row["stats"]["num_turns"] for row in rows]
        assert len(rows) == 8 and all(row["stats"]["num_turns"] == sum(m["role"] == "assistant" for m in row["messages"]) for row in rows)
        assert (metrics["num_turns/max"], metrics["num_turns/mean"]) == (max(turns), pytest.approx(sum(turns) / 8))
        assert max(turns) <= 3  # env.max_turns=2 questions at most, then the forced diagnosis turn
        questions = sum(row["stats"]["questions"] for row in rows)
        assert metrics["env/questions"] == questions  # the step's count
        # the patient answered every question a doctor asked, in one batched request per round (2 rounds at most)
        assert metrics["env_llm/replies"] == questions
        assert (metrics["env_llm/requests"] > 0) == (questions > 0) and metrics["env_llm/requests"] <= 2
        assert metrics["env_llm/wait_s"] <= metrics["timing_s/gen"]  # the patient's time is inside the doctor's rollout
    assert all(e["messages"][0]["role"] == "user" for e in episodes(tmp_path / "validation" / "step_2.jsonl"))

    # the trained policy against the rule-based patient: no Env-LLM worker is started
    rule = posttrain("eval", "--preset", "doctor_grpo", "--checkpoint", str(tmp_path), *models,
                     f"trainer.default_local_dir={tmp_path / 'eval'}", *TINY_DOCTOR_RUN, "env.options.patient=rule",
                     "--dump-episodes", str(tmp_path / "rule.jsonl"))
    reported = {name: text.split()[0] for name, text in (line.split(": ") for line in rule.stdout.splitlines() if line.startswith("val/"))}
    rows = episodes(tmp_path / "rule.jsonl")
    assert len(rows) == 4 and float(reported["val/synthetic_doctor/acc/mean@1"]) == sum(r["success"] for r in rows) / 4
    assert "val/env_llm/requests" not in reported


def test_a_missing_patient_model_is_refused_before_any_worker_starts(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--preset", "doctor_grpo", f"env.llm.model_path={tmp_path / 'nope'}",
         f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path}", *TINY_DOCTOR_RUN],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    assert "nope" in done.stderr and "neither a built-in model" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_doctor_grpo_async_reaches_the_env_llm_worker_from_its_generator(tmp_path):
    """Async mode: the generator's agent loop asks the run's Env-LLM worker (colocated with the
    trainer) for the patient's replies, through the same worker group the sync loop uses."""
    tiny = str(cached_tiny_model("llama"))
    posttrain("train", "--preset", "doctor_grpo", f"actor_rollout_ref.model.path={tiny}", f"env.llm.model_path={tiny}",
              f"trainer.default_local_dir={tmp_path}", *TINY_DOCTOR_RUN, "trainer.mode=async", "trainer.val_before_train=false")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        metrics = record["metrics"]
        # the patient answered every question the generator's doctor asked (the client's counts come back with the unit)
        assert metrics["env_llm/replies"] == metrics["env/questions"]
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["async/staleness/max"] <= 1

