"""A synchronous GRPO step of posttrain over a step of TRL's GRPOTrainer, same task and shape, one run.

Task: SmolLM2-135M-Instruct (``--model``), two-digit addition from posttrain's ``arithmetic``
preparer (written once here, read by both), 16 prompts x 4 samples per step, <= 64 new tokens,
temperature 1, no KL (posttrain: ``actor.use_kl_loss=false``, ``algorithm.use_kl_in_reward=false``;
TRL: ``beta=0``), one optimizer step per step, lr 1e-5 constant,
AdamW with weight decay 0.01, gradient clipping at 1.0, clip ratio 0.2, token-mean loss, group-std
advantages, the prompts unshuffled (both see the same prompts in the same order, through the same
chat template), and posttrain's arithmetic score as the reward of both. Like with like:
  dtype      ``--dtype`` on both sides: ``auto`` (default) is bfloat16 autocast over float32 weights
             where the CPU computes bf16 natively (AVX512-BF16 or AMX), float32 elsewhere (on an
             AVX2-only CPU bf16 is emulated and many times slower, on both sides alike);
  attention  ``--attn`` for the trained model on both sides (default eager, posttrain's CPU
             default); HF ``generate`` runs with sdpa on both sides;
  engine     the same rollout engine on both sides, in pairs of runs:
    HF generate: ``posttrain train`` with ``actor_rollout_ref.rollout.name=hf`` against TRL's
                 default (``use_vllm=False``);
    vLLM:        ``posttrain train`` with vLLM (its default) against TRL with vLLM in colocate mode
                 (``use_vllm=True, vllm_mode="colocate"``), when TRL's colocate mode runs with this
                 vLLM; if it does not, the script says what failed and compares posttrain's vLLM
                 run with TRL's default instead.
Micro-batches: TRL's of ``--micro-batch`` samples (16); posttrain's as its preset's default, a budget of
2,048 real tokens (``use_dynamic_bsz``), or ``--micro-batch`` samples with ``--posttrain-micro-batch
samples``. posttrain's update also leaves out the samples whose advantage is 0 (groups that all scored
the same; ``actor.skip_zero_advantage``, exact), which TRL runs; their share is printed, and
``--no-skip`` runs them (the update's work then equals TRL's).
``--engines hf`` runs the HF generate pair only, and then ends on the update-phase ratio.
The TRL Python is ``--trl-python`` or ``$POSTTRAIN_TRL_PYTHON``; this script installs nothing.
It must have the same torch and transformers as this one (docs/performance.md, "Comparing with
TRL", says how to make it). The runs go one after the other.

A step's time is the wall time from the end of the previous step to the end of this one (data,
generation, reward, logprobs, update, weight sync, logging: what the user waits per step), read
from metrics.jsonl's record times for posttrain and from a TrainerCallback for TRL. Step 1 holds
the engines' warm-up, so the medians are over steps 2..N. Phases: posttrain's ``timing_s/*``;
TRL's generation (``_generate_single_turn``), the rest of its generate-and-score (rewards,
advantages, logprob passes) and its update (the step's remainder). Beside the wall time, the CPU
seconds that the side's whole process tree used in the same interval, read from /proc when the
step's end appears, and the cores it kept busy (CPU over wall); when the sides' cores differ by
more than ``CORES_APART``, other work shared the machine and the script says the run is to be
repeated. Printed: each run's per-step times and medians, phases, mean response length and reward
(the same model sampling at T=1 should write about as much), the same-engine ratios (whole step,
and the update phase alone), and last
``posttrain_over_trl_step: <median step of posttrain's default (vLLM) / of TRL's default (HF generate)>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def run_posttrain(args: argparse.Namespace, model: str, data: Path, out: Path, engine: str) -> tuple[Run, list[dict]]:
    """A ``posttrain train`` run on the task with rollout engine ``engine`` (vllm or hf), and its metrics.jsonl step records."""
    run_dir = out / f"posttrain-{engine}"
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]", "data.shuffle=false", f"data.train_batch_size={args.prompts}",
        f"data.max_response_length={args.max_new_tokens}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.name={engine}", f"actor_rollout_ref.rollout.dtype={args.dtype}",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}", f"actor_rollout_ref.actor.dtype={args.dtype}",
        f"actor_rollout_ref.actor.attn_implementation={args.attn}",
        "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.actor.optim.lr={LR}", f"actor_rollout_ref.actor.optim.weight_decay={WEIGHT_DECAY}",
        "actor_rollout_ref.actor.optim.lr_scheduler=constant", f"actor_rollout_ref.actor.grad_clip={GRAD_CLIP}",
        f"actor_rollout_ref.actor.clip_ratio_low={CLIP_RATIO}", f"actor_rollout_ref.actor.clip_ratio_high={CLIP_RATIO}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.ppo_epochs=1",
        f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=1", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
    ]
    if args.posttrain_micro_batch == "samples":
        overrides.append("actor_rollout_ref.actor.use_dynamic_bsz=false")
    if args.no_skip:
        overrides.append("actor_rollout_ref.actor.skip_zero_advantage=false")
    command = [sys.executable, "-m", "posttrain.cli", "train", "--preset", "arithmetic_grpo", *overrides]
    metrics_file = run_dir / "metrics.jsonl"
    cpu = run_watched(command, out / f"posttrain-{engine}.log", os.environ | {"PYTHONUNBUFFERED": "1"}, "posttrain train",
                      lambda: count_in(metrics_file, '"timing_s/step"'))
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    records = [r for r in records if r["step"] > 0 and "timing_s/step" in r["metrics"]]
    label = "posttrain (vLLM)" if engine == "vllm" else "posttrain (HF generate)"
    return Run(label, [r["time"] for r in records], cpu), records


def run_trl(args: argparse.Namespace, python: str, model: str, data: Path, out: Path, vllm: bool) -> tuple[Run, dict]:
    """TRL's GRPOTrainer on the task (HF generate, or vLLM colocate), and the driver's JSON (TRL's logs, phases)."""
    name = "trl-vllm" if vllm else "trl-hf"
    result, steps_file = out / f"{name}.json", out / f"{name}_steps.txt"
    command = [
        python, str(DRIVER), "--model", model, "--train", str(data / "train.parquet"), "--out", str(result),
        "--steps-file", str(steps_file),
        "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n), "--micro-batch", str(args.micro_batch),
        "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1.0", "--lr", str(LR),
        "--weight-decay", str(WEIGHT_DECAY), "--grad-clip", str(GRAD_CLIP), "--clip-ratio", str(CLIP_RATIO),
        "--dtype", args.dtype, "--attn", args.attn, *(["--vllm"] if vllm else []),
    ]
    cpu = run_watched(command, out / f"{name}.log", _trl_env(), "TRL's GRPOTrainer", lambda: count_in(steps_file, "\n"))
    trl = json.loads(result.read_text())
    label = f"TRL {trl['trl']} ({trl['generation']})"
    return Run(label, [float(line) for line in steps_file.read_text().split()], cpu), trl


def posttrain_phases(records: list[dict]) -> dict[str, float]:
    """Median seconds of each ``timing_s/*`` phase over steps 2..N."""
    names = sorted({k for r in records[1:] for k in r["metrics"] if k.startswith("timing_s/") and k != "timing_s/step"})
    return {name.removeprefix("timing_s/"): statistics.median(r["metrics"].get(name, 0.0) for r in records[1:]) for name in names}


def trl_phases(run: Run, trl: dict) -> dict[str, float]:
    """Median seconds of TRL's generation, the rest of generate-and-score, and the update, over steps 2..N."""
    steps = step_times(run.step_end_times)
    phases = trl["phases"][1:]
    generation = [p.get("generation", 0.0) for p in phases]
    scored = [p.get("generate_and_score", 0.0) for p in phases]
    return {
        "generation": statistics.median(generation),
        "score, advantages, logprobs": statistics.median(s - g for s, g in zip(scored, generation)),
        "update": statistics.median(t - s for t, s in zip(steps, scored)),
    }


def print_phases(label: str, phases: dict[str, float]) -> None:
    print(f"  {label}: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()))


def step_times(end_times: list[float]) -> list[float]:
    """Seconds of steps 2..N: each from the end of the step before."""
    return [later - earlier for earlier, later in zip(end_times, end_times[1:])]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def print_runs(args: argparse.Namespace, runs: list[Run], records: tuple[list[dict], list[dict] | None],
               trl: tuple[dict, dict | None]) -> None:
    """Each run's step times and phases, the response lengths and rewards, and a warning when the
    runs kept different numbers of cores busy. ``runs``: posttrain HF, TRL HF[, posttrain vLLM[, TRL vLLM]]."""
    ours_hf, theirs_hf, *rest = runs
    ours_vllm, theirs_vllm = (rest + [None, None])[:2]
    (records_hf, records_vllm), (trl_hf, trl_vllm) = records, trl
    print(f"steps 2..{args.steps}: seconds from the end of the step before, wall and CPU (all of the side's processes)")
    for run in runs:
        print(run.line())
    print("phases (median over the same steps):")
    print_phases(ours_hf.label, posttrain_phases(records_hf))
    print_phases(theirs_hf.label, trl_phases(theirs_hf, trl_hf))
    if ours_vllm:
        print_phases(ours_vllm.label, posttrain_phases(records_vllm))
    if theirs_vllm:
        print_phases(theirs_vllm.label, trl_phases(theirs_vllm, trl_vllm))
    ours = [("HF", records_hf)] + ([("vLLM", records_vllm)] if records_vllm else [])
    trl_logs = [log for log in trl_hf["logs"] if "completions/mean_length" in log]
    lengths = ", ".join(f"posttrain ({name}) {mean([r['metrics']['response_length/mean'] for r in rs]):.1f}" for name, rs in ours)
    rewards = ", ".join(f"{mean([r['metrics']['critic/score/mean'] for r in rs]):.3f}" for _, rs in ours)
    skipped = ", ".join(f"({name}) {mean([r['metrics'].get('actor/rows_skipped', 0.0) for r in rs]):.2f}" for name, rs in ours)
    print(f"mean response length: {lengths}, TRL (HF) {mean([log['completions/mean_length'] for log in trl_logs]):.1f} tokens; "
          f"mean reward: {rewards}, {mean([log['reward'] for log in trl_logs]):.3f}; TRL's torch threads: {trl_hf['torch_threads']}")
    print(f"share of samples posttrain's update left out (advantage 0, exact): {skipped}")
    cores = [run.cores() for run in runs]
    if max(cores) - min(cores) > CORES_APART:
        print(f"warning: the runs kept {', '.join(f'{c:.2f}' for c in cores)} cores busy: other work shared the machine "
              "during some of them, so the ratios are not the frameworks' own; run again on a quiet machine")


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
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                        help="the training compute dtype, both sides (auto: bfloat16 autocast where the CPU has it natively)")
    parser.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="the trained model's attention, both sides")
    parser.add_argument("--posttrain-micro-batch", choices=["preset", "samples"], default="preset",
                        help="posttrain's micro-batches: its preset's token budget (default) or --micro-batch samples as TRL")
    parser.add_argument("--no-skip", action="store_true", help="posttrain runs the samples of zero advantage too, as TRL")
    parser.add_argument("--engines", choices=["both", "hf"], default="both", help="both pairs, or the HF generate pair only")
    args = parser.parse_args()
    if args.steps < 3:
        raise SystemExit(f"--steps {args.steps}: use at least 3 (step 1 is warm-up; the median needs steps 2..N)")
    python = check_trl_python(args.trl_python)

    import torch

    from posttrain.data.preparers.arithmetic import prepare_arithmetic
    from posttrain.models import resolve_dtype, resolve_model

    args.dtype = str(resolve_dtype(args.dtype, torch.device("cpu"))).removeprefix("torch.")
    model = str(resolve_model(args.model))
    out = Path(tempfile.mkdtemp(prefix="vs-trl-"))
    data = out / "data"
    prepare_arithmetic(data, train_size=args.prompts * args.steps, val_size=args.prompts, digits=2, num_operands=2,
                       operators="+", seed=0)
    print(f"{model}: two-digit addition, {args.prompts} prompts x {args.n}, <= {args.max_new_tokens} new tokens, T=1, no KL, "
          f"{args.steps} steps, micro-batches: TRL's {args.micro_batch} samples, posttrain's "
          f"{'its preset token budget' if args.posttrain_micro_batch == 'preset' else 'as many'}"
          f"{', every sample run' if args.no_skip else ''}, {args.dtype}, {args.attn} attention; logs in {out}", flush=True)

    ours_hf, records_hf = run_posttrain(args, model, data, out, "hf")
    theirs_hf, trl_hf = run_trl(args, python, model, data, out, vllm=False)
    ours_vllm = records_vllm = theirs_vllm = trl_vllm = None
    if args.engines == "both":
        ours_vllm, records_vllm = run_posttrain(args, model, data, out, "vllm")
        try:
            theirs_vllm, trl_vllm = run_trl(args, python, model, data, out, vllm=True)
        except SystemExit as failure:
            errors = [line.strip() for line in str(failure).splitlines() if re.search(r"\w+(Error|Exception): ", line)]
            print(f"TRL with vLLM in colocate mode did not run here: {errors[-1] if errors else str(failure).splitlines()[0]} "
                  f"(log: {out / 'trl-vllm.log'})")
    runs = [run for run in (ours_hf, theirs_hf, ours_vllm, theirs_vllm) if run is not None]
    for run in runs:
        if len(run.step_end_times) != args.steps or len(run.cpu_at_step_end) != args.steps:
            raise SystemExit(f"{run.label}: expected {args.steps} step ends, read {len(run.step_end_times)} times and "
                             f"{len(run.cpu_at_step_end)} CPU samples; see the logs in {out}")
    print_runs(args, runs, (records_hf, records_vllm), (trl_hf, trl_vllm))

    def ratio(a: Run, b: Run) -> float:
        return statistics.median(step_times(a.step_end_times)) / statistics.median(step_times(b.step_end_times))

    update_ratio = posttrain_phases(records_hf)["update_actor"] / trl_phases(theirs_hf, trl_hf)["update"]
    left_out = mean([r["metrics"].get("actor/rows_skipped", 0.0) for r in records_hf])
    work = f" (posttrain's update left out {left_out:.2f} of the samples, TRL's none)" if left_out else " (the same samples)"
    print(f"same engine (HF generate): posttrain over TRL, step {ratio(ours_hf, theirs_hf):.3f}, update phase {update_ratio:.3f}{work}")
    if theirs_vllm:
        print(f"same engine (vLLM): posttrain over TRL, step {ratio(ours_vllm, theirs_vllm):.3f}")
    if ours_vllm:
        print(f"posttrain_over_trl_step: {ratio(ours_vllm, theirs_hf):.3f}")
    else:
        print(f"posttrain_over_trl_update: {update_ratio:.3f}")


if __name__ == "__main__":
    main()
