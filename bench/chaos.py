"""Kill-anywhere equivalence at random moments: N runs of the same short training, each killed once
(SIGKILL) at a random time, must end with the uninterrupted run's metrics and prompts.

One uninterrupted reference run first (the tiny model, HF rollout, ``--steps`` steps with a
checkpoint after each, timed from its workers being up (``processes.json``) to its last step
logged). Then, for each of ``--runs`` runs of the same command, a moment is drawn uniformly in that
time after the run's workers are up, and the target alternates: the policy worker (the run restarts
itself, ``trainer.max_restarts``), then the controller, i.e. the ``posttrain train`` process (the same
command is run again, as a person would). A run counts as equal when it exits 0, ``metrics.jsonl`` has each step once with every
value equal to the reference's (wall-clock ones and ``run/restarts`` aside:
``scripts/compare_metrics.py``) and ``trained_prompts.jsonl`` names the same prompts at each step.

    .venv/bin/python -m bench.chaos --runs 6

The last line is ``chaos_runs_equal: <k>/<N>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.compare_metrics import differences

VOWEL_REWARD = '''
def compute_score(solution_str, ground_truth):
    return sum(c in "aeiou" for c in solution_str) / max(len(solution_str), 1)
'''


def command(run_dir: Path, model: str, reward: Path, steps: int) -> list[str]:
    return [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={run_dir}",
        "data.builtin_options.train_size=8", "data.builtin_options.val_size=4", "data.train_batch_size=4", "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf", f"custom_reward_function.path={reward}",
        "trainer.logger=[jsonl]", f"trainer.total_training_steps={steps}", f"trainer.total_epochs={(steps + 1) // 2}",
        "trainer.save_freq=1", "trainer.test_freq=2", "trainer.max_restarts=3",
    ]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 300) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def one_run(argv: list[str], run_dir: Path, target: str | None, at_s: float) -> tuple[int, str]:
    """The run, killed ``at_s`` after its workers are up (``target`` None: not killed); then, for a
    killed controller, the same command again. Returns (exit code, what happened)."""
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    what = "not killed"
    if target is not None and wait_for(run_dir / "processes.json", process):
        time.sleep(at_s)
        steps = [r["step"] for r in jsonl(run_dir / "metrics.jsonl")]
        if process.poll() is None:
            what = f"{target} killed {at_s:.1f} s after its workers were up, after step {max(steps, default=0)}"
            if target == "controller":
                process.send_signal(signal.SIGKILL)
            else:
                try:
                    os.kill(json.loads((run_dir / "processes.json").read_text())["actor"][0], signal.SIGKILL)
                except ProcessLookupError:  # between attempts, or the run is closing
                    what = f"no worker to kill {at_s:.1f} s after start, after step {max(steps, default=0)}"
        else:
            what = f"finished before the kill at {at_s:.1f} s"
    code = process.wait(timeout=900)
    if code == -signal.SIGKILL and target == "controller":
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
        what += ", the same command run again"
    log.close()
    return code, what


def equal(run_dir: Path, reference: Path) -> str | None:
    """None when ``run_dir`` ended as ``reference`` did; else what differs."""
    got, want = jsonl(run_dir / "metrics.jsonl"), jsonl(reference / "metrics.jsonl")
    steps = [r["step"] for r in got]
    if len(steps) != len(set(steps)):
        return f"a step logged twice: {steps}"
    _, found = differences(want, got)
    if found:
        return f"{len(found)} values differ, e.g. {found[0]}"
    if jsonl(run_dir / "trained_prompts.jsonl") != jsonl(reference / "trained_prompts.jsonl"):
        return "the prompts trained at some step differ"
    return None


def main() -> None:
    from posttrain.models import cached_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here (default: a temporary one)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    model = str(cached_tiny_model("llama"))
    with tempfile.TemporaryDirectory(prefix="posttrain-chaos-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        reward = root / "vowels.py"
        reward.write_text(VOWEL_REWARD)
        reference = root / "reference"
        start = time.perf_counter()
        process = subprocess.Popen(command(reference, model, reward, args.steps), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(reference / "processes.json", process)
        up = time.time()
        if process.wait(timeout=900) != 0:
            raise SystemExit(f"the reference run failed; its directory: {reference}")
        training = jsonl(reference / "metrics.jsonl")[-1]["time"] - up  # from its workers up to its last step logged
        print(f"reference: {args.steps} steps, {time.perf_counter() - start:.0f} s in all, the last step logged "
              f"{training:.1f} s after its workers were up", flush=True)
        equal_runs = 0
        for i in range(args.runs):
            target = ("worker", "controller")[i % 2]
            at_s = rng.uniform(0.0, 1.0) * training
            run_dir = root / f"run_{i}"
            code, what = one_run(command(run_dir, model, reward, args.steps), run_dir, target, at_s)
            problem = f"exit code {code}" if code != 0 else equal(run_dir, reference)
            restarts = max((r["metrics"].get("run/restarts", 0) for r in jsonl(run_dir / "metrics.jsonl")), default=0)
            equal_runs += problem is None
            print(f"run {i}: {what}; restarts {restarts:g}; {'equal' if problem is None else 'DIFFERENT: ' + problem}", flush=True)
    print(f"chaos_runs_equal: {equal_runs}/{args.runs}")


if __name__ == "__main__":
    main()
