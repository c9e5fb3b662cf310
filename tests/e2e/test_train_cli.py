"""The real CLI, end to end, on a tiny model with vLLM on CPU and local Ray: GRPO, PPO with a
critic, resume exactly at an epoch boundary, ReMax with the Ray dashboard. Each run checks the metrics
file a person would read."""

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from posttrain.models import cached_tiny_model
from posttrain.trainer.provenance import package_version
from tests.e2e import cli_runs
from tests.e2e.cli_runs import episodes

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# 8 training prompts in batches of 4: an epoch is 2 steps.
TINY_RUN = [
    "data.builtin_options.train_size=8", "data.builtin_options.val_size=4", "data.train_batch_size=4",
    "data.max_response_length=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "trainer.logger=[console,jsonl]", "trainer.test_freq=2",
    # a tiny random model scores about 0 on every sample, so every group ties and the update would run
    # no sample (actor.skip_zero_advantage); run them all, so the update and its metrics are exercised
    "actor_rollout_ref.actor.skip_zero_advantage=false",
]
# the default back on, for the runs whose rewards vary between a group's samples (so the update has samples to run)
DEFAULT_SKIP = "actor_rollout_ref.actor.skip_zero_advantage=true"
# Hugging Face generate instead of vLLM, for the runs whose point is not the engine: a worker that does
# not import vLLM takes about 8 s less CPU to start (measured on the async kill tests), each start
HF_ROLLOUT = "actor_rollout_ref.rollout.name=hf"


def run_train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={run_dir}", *TINY_RUN, *overrides,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def train(run_dir: Path, *overrides: str) -> list[dict]:
    run_train(run_dir, *overrides)
    return cli_runs.records(run_dir)


def validation_rows(path: Path) -> list[dict]:
    """A validation's episodes, each checked against the arithmetic scorer run again on its answer."""
    from posttrain.rewards import arithmetic

    rows = episodes(path)
    for row in rows:
        scored = arithmetic.compute_score(row["messages"][-1]["content"], row["ground_truth"])
        assert (row["reward"], row["success"]) == (scored["score"], bool(scored["acc"])), row
    return rows


def finite(record: dict, name: str) -> float:
    value = record["metrics"][name]
    assert value is not None and math.isfinite(value), f"{name} = {value}"
    return value


def test_grpo_by_default_leaves_out_the_samples_of_tied_groups(tmp_path):
    # the default (TINY_RUN turns it off): samples whose advantage is 0 everywhere are not run; a tiny
    # random model's groups mostly all score 0, and a mean over no samples is not reported
    records = train(tmp_path, "trainer.total_training_steps=1", "trainer.val_before_train=false", DEFAULT_SKIP, HF_ROLLOUT)
    metrics = records[-1]["metrics"]
    left_out = finite(records[-1], "actor/rows_skipped")
    assert left_out > 0
    assert ("actor/pg_loss" in metrics) == (left_out < 1.0)
    if left_out == 1.0:
        assert metrics["actor/grad_norm"] == 0.0 and metrics["critic/advantages/max"] == metrics["critic/advantages/min"] == 0.0


# save_freq unset: the last step is saved all the same; each step's samples written, to check its metrics against
TWO_STEPS = ("trainer.total_training_steps=2", "trainer.total_epochs=2", "trainer.rollout_data_dir=rollouts")


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> tuple[Path, list[dict], str]:
    """GRPO for two steps, the first of two epochs, on a Ray the CLI starts itself (the default path a new
    user takes): one run that two tests read, the second continuing a copy. Returns the run directory,
    its metrics and its output."""
    run_dir = tmp_path_factory.mktemp("grpo_two_steps")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("RAY_ADDRESS", raising=False)  # not the shared cluster of tests/e2e/conftest.py
        done = run_train(run_dir, *TWO_STEPS)
    return run_dir, cli_runs.records(run_dir), done.stdout


def test_grpo_two_steps(two_steps, tmp_path):
    run_dir, records, output = two_steps
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/arithmetic/acc/mean@1" in records[0]["metrics"]
    for record in records[1:]:
        for name in ("critic/score/mean", "critic/advantages/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
                     "response_length/mean", "timing_s/gen", "timing_s/update_actor", "perf/throughput"):
            finite(record, name)
        # the step's metrics are those of the samples it wrote (trainer.rollout_data_dir): 4 prompts x 2 samples
        samples = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{record['step']}.jsonl").read_text().splitlines()]
        assert len(samples) == 8 and sorted(Counter(s["uid"] for s in samples).values()) == [2, 2, 2, 2]
        lengths = [s["response_tokens"] for s in samples]
        assert finite(record, "response_length/mean") == pytest.approx(sum(lengths) / 8)
        assert (record["metrics"]["response_length/max"], record["metrics"]["response_length/min"]) == (max(lengths), min(lengths))
        assert finite(record, "critic/score/mean") == pytest.approx(sum(s["reward"] for s in samples) / 8)
        for uid in {s["uid"] for s in samples}:  # GRPO: a group's advantages sum to 0
            assert sum(s["advantage"] for s in samples if s["uid"] == uid) == pytest.approx(0.0, abs=1e-5)
        assert finite(record, "training/weight_version") == record["step"] - 1  # generated by the weights of the step before
        # the policy's resident memory at the step's end is at most its high-water mark so far, which only rises
        assert finite(record, "memory/policy/rss_gb") <= finite(record, "memory/policy/peak_rss_gb")
    assert finite(records[1], "memory/policy/peak_rss_gb") <= finite(records[2], "memory/policy/peak_rss_gb")
    # the share of the 8 training rows drawn so far: half after the first batch of 4, all after the second
    assert [record["metrics"]["training/rows_drawn"] for record in records[1:]] == [0.5, 1.0]
    for step in (0, 2):  # each validation's metrics are those of the 4 validation prompts' episodes, as scored
        rows = validation_rows(run_dir / "validation" / f"step_{step}.jsonl")
        assert records[step]["metrics"]["val/arithmetic/acc/mean@1"] == sum(row["success"] for row in rows) / 4
        assert records[step]["metrics"]["val/arithmetic/reward/mean@1"] == pytest.approx(sum(row["reward"] for row in rows) / 4)
        assert records[step]["metrics"]["val/reward/samples"] == 4
    # the last step keeps the policy with no save_freq, and says how to export it
    final = run_dir / "checkpoints" / "global_step_2"
    assert (final / "actor").is_dir() and (final / "manifest.json").is_file()
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert f"posttrain export {final} --out {run_dir / 'hf_model'}" in output
    assert (run_dir / "report" / "report.md").exists() and (run_dir / "report" / "reward.png").exists()
    assert (run_dir / "report" / "memory.png").exists()
    # what made the run: the command as typed, the libraries, the machine; named in the report
    made = json.loads((run_dir / "provenance.json").read_text())
    assert made["command"][1] == "train" and f"trainer.default_local_dir={run_dir}" in made["command"]
    assert made["libraries"]["torch"] == package_version("torch") and "Made by: posttrain" in (run_dir / "report" / "report.md").read_text()
    # the same command again: the run is finished, so it says so and trains nothing (no Ray started)
    again = run_train(run_dir, *TWO_STEPS)
    assert "this run is finished" in again.stdout and f"posttrain export {final}" in again.stdout
    assert "Started a local Ray instance" not in again.stderr + again.stdout and "resumed from" not in again.stdout
    assert cli_runs.records(run_dir) == records

    # The trained policy: exported as a Hugging Face directory, and validated again from its checkpoint.
    export = subprocess.run([sys.executable, "-m", "posttrain.cli", "export", str(run_dir), "--out", str(tmp_path / "hf")],
                            capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.num_hidden_layers == 2
    # moved a quarter of the way back toward the model it was trained from (WiSE-FT): each weight on that line
    toward = subprocess.run([sys.executable, "-m", "posttrain.cli", "export", str(run_dir), "--out", str(tmp_path / "toward"),
                             "--weight", "0.75"], capture_output=True, text=True, timeout=300)
    assert toward.returncode == 0, toward.stderr[-2000:]
    start, end, mixed = (AutoModelForCausalLM.from_pretrained(path).state_dict()
                         for path in (cached_tiny_model("llama"), tmp_path / "hf", tmp_path / "toward"))
    moved = max((end[name] - start[name]).abs().max().item() for name in end)  # two small steps: about 5e-7
    off_line = max((mixed[name] - (start[name] + 0.75 * (end[name] - start[name]))).abs().max().item() for name in end)
    assert moved > 0 and off_line < 0.1 * moved  # on the line, to a tenth of how far the policy moved
    assert max((mixed[name] - end[name]).abs().max().item() for name in end) > 0.2 * moved  # a quarter of the way back
    evaluation = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "eval", "--checkpoint", str(run_dir),
         f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"trainer.default_local_dir={tmp_path / 'eval'}", *TINY_RUN,
         # an evaluation reads no training set: a training batch larger than it cannot be refused
         "data.train_batch_size=100000", "actor_rollout_ref.actor.ppo_mini_batch_size=100000",
         "--dump-episodes", str(tmp_path / "episodes.jsonl")],
        capture_output=True, text=True, timeout=300,
    )
    assert evaluation.returncode == 0, evaluation.stdout[-2000:] + evaluation.stderr[-2000:]
    reported = {name: text.split()[0] for name, text in (line.split(": ") for line in evaluation.stdout.splitlines() if line.startswith("val/"))}
    assert float(reported["val/arithmetic/acc/mean@1"]) == records[2]["metrics"]["val/arithmetic/acc/mean@1"]
    from posttrain.trainer.intervals import wilson

    low, high = wilson(round(float(reported["val/arithmetic/acc/mean@1"]) * 4), 4)  # each accuracy with its 95 % interval
    assert f"val/arithmetic/acc/mean@1: {reported['val/arithmetic/acc/mean@1']}  (95% interval {low:.4f} to {high:.4f})" in evaluation.stdout
    # the checkpoint is the policy that ran the last validation: greedy, it writes the same answers
    evaluated, validated = validation_rows(tmp_path / "episodes.jsonl"), validation_rows(run_dir / "validation" / "step_2.jsonl")
    assert [row["messages"] for row in evaluated] == [row["messages"] for row in validated]


def test_ppo_with_a_critic_and_kl_in_the_reward(tmp_path):
    # 4 steps over 2 epochs; the critic takes 4 passes over each batch at lr 1e-3 (the default 1e-5 moves
    # a fresh value head too little in 4 steps to tell learning from noise). Measured with trainer.seed 1
    # to 3 (and as many data seeds): the last step's value loss is 0.43 to 0.60 times the first's with
    # vLLM, 0.43 to 0.57 with HF generate (what runs here: the critic, not the engine, is the point).
    records = train(
        tmp_path, "trainer.total_training_steps=4", "trainer.total_epochs=2", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "algorithm.adv_estimator=gae", "algorithm.lam=0.95", "algorithm.use_kl_in_reward=true",
        "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=4", "critic.ppo_epochs=4", "critic.optim.lr=1e-3",
        HF_ROLLOUT,
    )
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        for name in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean",
                     "critic/returns/mean", "critic/vf_explained_var", "critic/kl", "critic/rewards/mean", "timing_s/values"):
            finite(record, name)
    # the critic learns the returns: its value loss falls
    losses = [finite(record, "critic/vf_loss") for record in records]
    assert losses[-1] < 0.8 * losses[0], losses
    assert sum(losses[2:]) < sum(losses[:2]), losses


@pytest.fixture(scope="module")
def resumed_to_four(two_steps, tmp_path_factory) -> tuple[Path, list[dict], list[dict]]:
    """The two-step run continued on a copy (the first run stays as the other tests read it) for a second
    epoch, a checkpoint every 2 steps: (its directory, the first run's records, the copy's)."""
    run_dir, first, _ = two_steps
    copy = tmp_path_factory.mktemp("resumed") / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy, first, train(copy, "trainer.save_freq=2", "trainer.total_epochs=2")  # 2 epochs of 2 steps = 4 steps


def test_resume_exactly_at_an_epoch_boundary_continues_into_the_next_epoch(resumed_to_four):
    _, first, records = resumed_to_four
    assert first[-1]["step"] == 2
    assert records[:len(first)] == first  # kept as the first run wrote them (timings too): resumed, not started over
    resumed = [r for r in records[len(first):]]
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["metrics"]["training/epoch"] for r in resumed] == [1, 1]


def test_export_of_the_last_two_checkpoints_is_their_mean_and_moves_toward_the_start_after(two_steps, resumed_to_four,
                                                                                          tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from posttrain.cli import main

    run_dir = resumed_to_four[0]
    checkpoints = run_dir / "checkpoints"
    for source, out, options in ((checkpoints / "global_step_2", "at2", []), (checkpoints / "global_step_4", "at4", []),
                                 (run_dir, "mean", ["--average", "2"]), (run_dir, "toward", ["--average", "2", "--weight", "0.5"]),
                                 (two_steps[0], "runs", ["--with", str(run_dir)])):  # another run's last checkpoint
        assert main(["export", str(source), "--out", str(tmp_path / out), *options]) == 0
    err = capsys.readouterr().err
    assert err.count("posttrain export: the mean of steps 2, 4") == 2
    assert f"posttrain export: the mean of steps 2 of {two_steps[0]}; steps 4 of {run_dir}" in err
    start, at2, at4, mean, toward, runs = (AutoModelForCausalLM.from_pretrained(path).state_dict() for path in
                                           (cached_tiny_model("llama"), *(tmp_path / out for out in ("at2", "at4", "mean", "toward", "runs"))))
    assert max((at4[name] - at2[name]).abs().max().item() for name in at4) > 0
    assert max((mean[name] - (at2[name] + at4[name]) / 2).abs().max().item() for name in mean) < 1e-7
    # --with: the first run's step 2 (the copy's, before it went on) and the copy's step 4: the same sums, bit for bit,
    # and neither checkpoint alone
    assert all(torch.equal(runs[name], mean[name]) for name in mean)
    for alone in (at2, at4):
        assert not all(torch.equal(runs[name], alone[name]) for name in alone)
    # --weight after the mean: halfway from the model the run started from to the mean
    assert max((toward[name] - (start[name] + mean[name]) / 2).abs().max().item() for name in mean) < 1e-7


@pytest.mark.own_ray
def test_remax_scores_a_greedy_baseline_on_a_run_with_the_ray_dashboard(tmp_path):
    # one run for two things that each need a full step: ReMax's baseline, and the dashboard with the log link
    # Scores of 1 to 3 by response length: never 0, so the greedy baseline is never 0 and s - b differs from s.
    reward = tmp_path / "length_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 1.0 + len(solution_str) % 3\n")
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}",
        f"trainer.default_local_dir={tmp_path}", *TINY_RUN, "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "trainer.ray_dashboard=true", "algorithm.adv_estimator=remax", f"custom_reward_function.path={reward}", HF_ROLLOUT,
        "trainer.rollout_data_dir=rollouts",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "posttrain: Ray dashboard at http://127.0.0.1:" in done.stdout
    # the run directory links to the session's logs: every worker process's stdout and stderr
    assert (tmp_path / "ray_logs").is_symlink() and list((tmp_path / "ray_logs").glob("worker-*.err"))

    records = cli_runs.records(tmp_path)
    finite(records[0], "timing_s/gen_max")
    finite(records[0], "critic/advantages/mean")
    # the scores are those of the samples the step wrote, each 1 + its response's length in characters mod 3
    samples = [json.loads(line) for line in (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    scores = [s["reward"] for s in samples]
    assert len(samples) == 8 and scores == [1.0 + len(s["messages"][-1]["content"]) % 3 for s in samples]
    assert [finite(records[0], f"critic/score/{stat}") for stat in ("mean", "max", "min")] == \
        [pytest.approx(sum(scores) / 8), max(scores), min(scores)]
    # ReMax's returns are verl's reward-to-go: with the score on the last token, each token's return is the score
    for stat in ("max", "min"):
        assert finite(records[0], f"critic/returns/{stat}") == finite(records[0], f"critic/score/{stat}")
    finite(records[0], "actor/ppo_kl")
    assert finite(records[0], "actor/ppo_kl_k3") >= 0
