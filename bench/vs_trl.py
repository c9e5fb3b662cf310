"""A synchronous GRPO step of posttrain over a step of TRL's GRPOTrainer, same task and shape, one run.

Task: SmolLM2-135M-Instruct (``--model``), two-digit addition from posttrain's ``arithmetic``
preparer (written once here, read by both), 16 prompts x 4 samples per step, <= 64 new tokens,
temperature 1, no KL (posttrain: ``actor.use_kl_loss=false``, ``algorithm.use_kl_in_reward=false``;
TRL: ``beta=0``), one optimizer step per step in micro-batches of 16 samples, the same training
dtype (``--dtype``: bfloat16 by default, each side's default on a CPU or GPU that computes it
natively; both run it as mixed precision, float32 weights and optimizer with bfloat16 autocast),
lr 1e-5 constant, AdamW with weight decay 0.01, gradient clipping at 1.0, clip ratio 0.2,
token-mean loss, group-std advantages, the prompts unshuffled (both see the same prompts in the same order, through
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
the engines' warm-up, so the medians are over steps 2..N. Beside it, the CPU seconds that the side's
whole process tree (posttrain: the CLI, Ray and its worker with vLLM; TRL: its one process) used in
the same interval, read from /proc when the step's end appears, and the cores it kept busy (CPU over
wall). On a quiet machine both keep about 2 cores busy and the two ratios agree (measured: wall
0.679, CPU 0.640); when other work shares the machine, the side that ran beside it gets fewer cores
and more CPU seconds (shared caches), so neither ratio holds: the script then says so (the sides'
cores differ by more than ``CORES_APART``) and the run is to be repeated. Printed: each
side's per-step times and medians, posttrain's own ``timing_s/*`` phases (median over the same
steps), the mean response length and reward of each side (the same model sampling at T=1 should
write about as much), the CPU-seconds ratio, and last
``posttrain_over_trl_step: <median posttrain step / median TRL step>``, wall (target <= 0.45).
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "trl_grpo_driver.py"
TRL_PYTHON_ENV = "POSTTRAIN_TRL_PYTHON"
RECIPE = "README.md, section \"Comparing with TRL\""
POLL_S = 0.2
# Cores busy (CPU over wall) this far apart between the sides: other work shared the machine.
CORES_APART = 0.3
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


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by process ``root`` and every process under it,
    including its children that have ended (Linux ``/proc``)."""
    parents, ticks = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended while we looked
                continue
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def run_watched(command: list[str], log: Path, env: dict[str, str], what: str, steps_done: Callable[[], int]) -> list[float]:
    """Run ``command`` (output into ``log``); the CPU seconds of its process tree at the end of each
    step, read when ``steps_done()`` grows (polled every ``POLL_S``)."""
    cpu_at_step_end: list[float] = []
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            while process.poll() is None:
                time.sleep(POLL_S)
                missing = steps_done() - len(cpu_at_step_end)
                if missing > 0:
                    cpu_at_step_end += [tree_cpu_seconds(process.pid)] * missing
        finally:
            if process.poll() is None:
                process.kill()
    if process.returncode != 0:
        raise SystemExit(f"{what} failed (exit {process.returncode}); the end of {log}:\n{log.read_text()[-3000:]}")
    return cpu_at_step_end


def count_in(path: Path, text: str) -> int:
    return path.read_text().count(text) if path.exists() else 0


@dataclass
class Run:
    """One side's run: the wall time (unix s) and its processes' CPU seconds at the end of each step."""

    label: str
    step_end_times: list[float]
    cpu_at_step_end: list[float]

    def cores(self) -> float:
        """Cores kept busy over steps 2..N: median CPU seconds over median wall seconds."""
        return statistics.median(step_times(self.cpu_at_step_end)) / statistics.median(step_times(self.step_end_times))

    def line(self) -> str:
        wall, cpu = step_times(self.step_end_times), step_times(self.cpu_at_step_end)
        return (f"  {self.label:<26} wall {' '.join(f'{t:5.1f}' for t in wall)}  median {statistics.median(wall):5.1f} | "
                f"CPU {' '.join(f'{t:5.1f}' for t in cpu)}  median {statistics.median(cpu):5.1f} ({self.cores():.2f} cores)")


def run_posttrain(args: argparse.Namespace, model: str, data: Path, out: Path) -> tuple[Run, list[dict]]:
    """A ``posttrain train`` run on the task, and its metrics.jsonl step records."""
    run_dir = out / "posttrain"
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]", "data.shuffle=false", f"data.train_batch_size={args.prompts}",
        f"data.max_response_length={args.max_new_tokens}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}", f"actor_rollout_ref.actor.dtype={args.dtype}",
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
    metrics_file = run_dir / "metrics.jsonl"
    cpu = run_watched(command, out / "posttrain.log", os.environ | {"PYTHONUNBUFFERED": "1"}, "posttrain train",
                      lambda: count_in(metrics_file, '"timing_s/step"'))
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    records = [r for r in records if r["step"] > 0 and "timing_s/step" in r["metrics"]]
    return Run("posttrain (vLLM rollout)", [r["time"] for r in records], cpu), records


def run_trl(args: argparse.Namespace, python: str, model: str, data: Path, out: Path) -> tuple[Run, dict]:
    """TRL's GRPOTrainer on the task, and the driver's JSON (TRL's logs)."""
    result, steps_file = out / "trl.json", out / "trl_steps.txt"
    command = [
        python, str(DRIVER), "--model", model, "--train", str(data / "train.parquet"), "--out", str(result),
        "--steps-file", str(steps_file),
        "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n), "--micro-batch", str(args.micro_batch),
        "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1.0", "--lr", str(LR),
        "--weight-decay", str(WEIGHT_DECAY), "--grad-clip", str(GRAD_CLIP), "--clip-ratio", str(CLIP_RATIO),
        "--dtype", args.dtype,
    ]
    cpu = run_watched(command, out / "trl.log", _trl_env(), "TRL's GRPOTrainer", lambda: count_in(steps_file, "\n"))
    trl = json.loads(result.read_text())
    label = f"TRL {trl['trl']} ({trl['generation']})"
    return Run(label, [float(line) for line in steps_file.read_text().split()], cpu), trl


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
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="the training compute dtype, both sides (bfloat16: autocast over float32 weights)")
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
          f"{args.steps} steps, micro-batch {args.micro_batch}, {args.dtype}; logs in {out}", flush=True)

    ours, records = run_posttrain(args, model, data, out)
    theirs, trl = run_trl(args, python, model, data, out)
    for run in (ours, theirs):
        if len(run.step_end_times) != args.steps or len(run.cpu_at_step_end) != args.steps:
            raise SystemExit(f"{run.label}: expected {args.steps} step ends, read {len(run.step_end_times)} times and "
                             f"{len(run.cpu_at_step_end)} CPU samples; see the logs in {out}")
    print(f"steps 2..{args.steps}: seconds from the end of the step before, wall and CPU (all of the side's processes)")
    print(ours.line())
    print(theirs.line())
    print("posttrain's phases (timing_s/*, median over the same steps):")
    phases = sorted({k for r in records[1:] for k in r["metrics"] if k.startswith("timing_s/")})
    for phase in phases:
        print(f"  {phase:<28} {statistics.median(r['metrics'].get(phase, 0.0) for r in records[1:]):6.1f}")
    trl_steps = [log for log in trl["logs"] if "completions/mean_length" in log]
    print(f"mean response length: posttrain {mean([r['metrics']['response_length/mean'] for r in records]):.1f}, "
          f"TRL {mean([log['completions/mean_length'] for log in trl_steps]):.1f} tokens; "
          f"mean reward: posttrain {mean([r['metrics']['critic/score/mean'] for r in records]):.3f}, "
          f"TRL {mean([log['reward'] for log in trl_steps]):.3f}; TRL's torch threads: {trl['torch_threads']}")
    cpu_ratio = statistics.median(step_times(ours.cpu_at_step_end)) / statistics.median(step_times(theirs.cpu_at_step_end))
    print(f"posttrain over TRL in CPU seconds per step: {cpu_ratio:.3f}")
    if abs(ours.cores() - theirs.cores()) > CORES_APART:
        print(f"warning: posttrain kept {ours.cores():.2f} cores busy and TRL {theirs.cores():.2f}: other work shared the "
              "machine during one of the runs, so neither ratio is the frameworks' own; run again on a quiet machine")
    wall_ratio = statistics.median(step_times(ours.step_end_times)) / statistics.median(step_times(theirs.step_end_times))
    print(f"posttrain_over_trl_step: {wall_ratio:.3f}")


if __name__ == "__main__":
    main()
