"""A synchronous GRPO step of posttrain over a step of TRL's GRPOTrainer, same task and shape, one run.

Task: SmolLM2-135M-Instruct (``--model``), two-digit addition from posttrain's ``arithmetic``
preparer (written once here, read by both), 16 prompts x 4 samples per step, <= 64 new tokens,
temperature 1, no KL (posttrain: ``actor.use_kl_loss=false``, ``algorithm.use_kl_in_reward=false``;
TRL: ``beta=0``), one optimizer step per step in micro-batches of 16 samples, float32, lr 1e-5
constant, AdamW with weight decay 0.01, gradient clipping at 1.0, clip ratio 0.2, token-mean loss,
group-std advantages, the prompts unshuffled (both see the same prompts in the same order, through
the same chat template), and posttrain's arithmetic score as the reward of both.
  posttrain: ``posttrain train`` (the arithmetic preset with the overrides above), vLLM rollouts
             (its default engine), validation off.
  TRL:       ``GRPOTrainer`` (``bench/trl_grpo_driver.py``) in the TRL Python, HF ``generate``
             (TRL's default; its vLLM modes need a GPU server or vLLM in colocate mode).
The TRL Python is ``--trl-python`` or ``$POSTTRAIN_TRL_PYTHON``; this script installs nothing.
It must have the same torch and transformers as this one (README, "Comparing with TRL", says how
to make it). The two runs go one after the other, posttrain first.

A step's time is the wall time from the end of the previous step to the end of this one (data,
generation, reward, logprobs, update, weight sync, logging: what the user waits per step), read
from metrics.jsonl's record times for posttrain and from a TrainerCallback for TRL. Step 1 holds
the engines' warm-up, so the medians are over steps 2..N. Printed: each side's per-step times and
median, posttrain's own ``timing_s/*`` phases (median over the same steps), the mean response
length and reward of each side (the same model sampling at T=1 should write about as much), and
last ``posttrain_over_trl_step: <median posttrain step / median TRL step>`` (target <= 0.45).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "trl_grpo_driver.py"
TRL_PYTHON_ENV = "POSTTRAIN_TRL_PYTHON"
RECIPE = "README.md, section \"Comparing with TRL\""
# What both sides share, beyond the task's shape; posttrain's values (the preset's, or its defaults).
LR, WEIGHT_DECAY, GRAD_CLIP, CLIP_RATIO = 1e-5, 0.01, 1.0, 0.2


def check_trl_python(python: str | None) -> str:
    """The TRL Python's path, once it imports trl with this Python's torch and transformers."""
    if not python:
        raise SystemExit(f"no TRL Python: pass --trl-python PATH or set {TRL_PYTHON_ENV}=PATH ({RECIPE} says how to make one)")
    if not shutil.which(python):
        raise SystemExit(f"--trl-python {python}: no such executable; make one as {RECIPE} says")
    probe = "import json, torch, transformers, trl; print(json.dumps([trl.__version__, torch.__version__, transformers.__version__]))"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=_trl_env())
    if done.returncode != 0:
        raise SystemExit(f"{python} cannot import trl, torch and transformers ({done.stderr.strip().splitlines()[-1:]}); "
                         f"install TRL there as {RECIPE} says")
    trl_version, torch_version, transformers_version = json.loads(done.stdout.strip().splitlines()[-1])
    import torch
    import transformers

    ours = (torch.__version__, transformers.__version__)
    if (torch_version, transformers_version) != ours:
        raise SystemExit(f"{python} has torch {torch_version} and transformers {transformers_version}, this Python "
                         f"torch {ours[0]} and transformers {ours[1]}: the comparison needs the same libraries; "
                         f"make the TRL Python as {RECIPE} says")
    print(f"TRL {trl_version} in {python}; torch {torch_version}, transformers {transformers_version} on both sides")
    return python


def _trl_env() -> dict[str, str]:
    """The driver imports posttrain's reward from this checkout."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return os.environ | {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_logged(command: list[str], log: Path, env: dict[str, str], what: str) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}); the end of {log}:\n{log.read_text()[-3000:]}")


def run_posttrain(args: argparse.Namespace, model: str, data: Path, out: Path) -> list[dict]:
    """metrics.jsonl's step records of a ``posttrain train`` run on the task."""
    run_dir = out / "posttrain"
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]", "data.shuffle=false", f"data.train_batch_size={args.prompts}",
        f"data.max_response_length={args.max_new_tokens}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}", "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.actor.optim.lr={LR}", f"actor_rollout_ref.actor.optim.weight_decay={WEIGHT_DECAY}",
        "actor_rollout_ref.actor.optim.lr_scheduler=constant", f"actor_rollout_ref.actor.grad_clip={GRAD_CLIP}",
        f"actor_rollout_ref.actor.clip_ratio_low={CLIP_RATIO}", f"actor_rollout_ref.actor.clip_ratio_high={CLIP_RATIO}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.ppo_epochs=1",
        f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=1", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
    ]
    command = [sys.executable, "-m", "posttrain.cli", "train", "--preset", "arithmetic_grpo", *overrides]
    run_logged(command, out / "posttrain.log", os.environ | {"PYTHONUNBUFFERED": "1"}, "posttrain train")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["step"] > 0 and "timing_s/step" in r["metrics"]]


def run_trl(args: argparse.Namespace, python: str, model: str, data: Path, out: Path) -> dict:
    """The driver's JSON: step end times and TRL's logs."""
    result = out / "trl.json"
    command = [
        python, str(DRIVER), "--model", model, "--train", str(data / "train.parquet"), "--out", str(result),
        "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n), "--micro-batch", str(args.micro_batch),
        "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1.0", "--lr", str(LR),
        "--weight-decay", str(WEIGHT_DECAY), "--grad-clip", str(GRAD_CLIP), "--clip-ratio", str(CLIP_RATIO),
    ]
    run_logged(command, out / "trl.log", _trl_env(), "TRL's GRPOTrainer")
    return json.loads(result.read_text())


def step_times(end_times: list[float]) -> list[float]:
    """Seconds of steps 2..N: each from the end of the step before."""
    return [later - earlier for earlier, later in zip(end_times, end_times[1:])]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl-python", default=os.environ.get(TRL_PYTHON_ENV),
                        help=f"a Python with TRL and this Python's torch and transformers (default ${TRL_PYTHON_ENV})")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model name or a local model directory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16, help="samples per forward/backward, both sides")
    args = parser.parse_args()
    if args.steps < 3:
        raise SystemExit(f"--steps {args.steps}: use at least 3 (step 1 is warm-up; the median needs steps 2..N)")
    python = check_trl_python(args.trl_python)

    from posttrain.data.preparers.arithmetic import prepare_arithmetic
    from posttrain.models import resolve_model

    model = str(resolve_model(args.model))
    out = Path(tempfile.mkdtemp(prefix="vs-trl-"))
    data = out / "data"
    prepare_arithmetic(data, train_size=args.prompts * args.steps, val_size=args.prompts, digits=2, num_operands=2,
                       operators="+", seed=0)
    print(f"{model}: two-digit addition, {args.prompts} prompts x {args.n}, <= {args.max_new_tokens} new tokens, T=1, no KL, "
          f"{args.steps} steps, micro-batch {args.micro_batch}, float32; logs in {out}", flush=True)

    records = run_posttrain(args, model, data, out)
    trl = run_trl(args, python, model, data, out)

    ours = step_times([r["time"] for r in records])
    theirs = step_times(trl["step_end_times"])
    if len(ours) != args.steps - 1 or len(theirs) != args.steps - 1:
        raise SystemExit(f"expected {args.steps} steps from each side, got posttrain {len(ours) + 1} and TRL {len(theirs) + 1}; see {out}")
    phases = sorted({k for r in records[1:] for k in r["metrics"] if k.startswith("timing_s/")})
    trl_steps = [log for log in trl["logs"] if "completions/mean_length" in log]
    print(f"steps 2..{args.steps}, seconds from the end of the step before:")
    print(f"  posttrain (vLLM rollout):   {' '.join(f'{t:6.1f}' for t in ours)}   median {statistics.median(ours):6.1f}")
    print(f"  TRL {trl['trl']} ({trl['generation']}): {' '.join(f'{t:6.1f}' for t in theirs)}   median {statistics.median(theirs):6.1f}")
    print("posttrain's phases (timing_s/*, median over the same steps):")
    for phase in phases:
        print(f"  {phase:<28} {statistics.median(r['metrics'].get(phase, 0.0) for r in records[1:]):6.1f}")
    print(f"mean response length: posttrain {mean([r['metrics']['response_length/mean'] for r in records]):.1f}, "
          f"TRL {mean([log['completions/mean_length'] for log in trl_steps]):.1f} tokens; "
          f"mean reward: posttrain {mean([r['metrics']['critic/score/mean'] for r in records]):.3f}, "
          f"TRL {mean([log['reward'] for log in trl_steps]):.3f}; TRL's torch threads: {trl['torch_threads']}")
    print(f"posttrain_over_trl_step: {statistics.median(ours) / statistics.median(theirs):.3f}")


if __name__ == "__main__":
    main()
