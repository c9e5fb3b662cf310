"""Trained samples per second, asynchronous over synchronous training, on the same task in one run,
with an environment that adds a latency to every agent-loop step.

Task: the built-in arithmetic prompts played in an agent environment (``bench/latency_env.py``):
``--env-steps`` turns per episode (tool calls, then the answer), each environment step waiting
``latency`` ms per batched step, like one service round-trip, the answer scored at the end.
For each latency in ``--latencies`` the same run is made twice through the CLI — ``trainer.mode=sync``
and ``trainer.mode=async`` — and throughput is the samples trained between the first and the last
logged step divided by the time between them (start-up and the first step, which includes engine
warm-up, are left out).

The async side is configured for a latency-bound agent task: two generators (``--generators``,
half a CPU each, so the trainer keeps one), each taking a whole batch per call (``--unit-groups``),
and ``async.max_staleness=2``. A generator plays its episodes' turns one after another, waiting on
the environment between them, so with one generator that wait is the bottleneck and async can hide
only the update behind it; two generators on two different batches wait side by side, which
staleness 2 allows. ``--generators 1 --max-staleness 1`` gives the one-generator figure.

Prints the curve (sync and async samples/s and the ratio per latency); the last line is
``async_over_sync_at_200ms: <ratio>`` (target >= 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def throughput(run_dir: Path, samples_per_step: int) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "actor/pg_loss" in r["metrics"]]
    first, last = steps[0], steps[-1]
    return samples_per_step * (last["step"] - first["step"]) / (last["time"] - first["time"])


def run(mode: str, latency_ms: float, args: argparse.Namespace, out: Path) -> float:
    run_dir = out / f"{mode}_{int(latency_ms)}"
    command = [
        sys.executable, "-m", "posttrain.cli", "train", f"actor_rollout_ref.model.path={args.model}",
        f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=100",
        "env.name=latency_arithmetic", f"env.path={BENCH / 'latency_env.py'}", "env.class_name=LatencyArithmeticEnv",
        f"env.options.latency_ms={latency_ms}", f"env.options.steps={args.env_steps}", f"env.max_turns={args.env_steps}",
        f"env.max_turn_tokens={args.turn_tokens}", "env.max_obs_length=16",
        f"data.max_response_length={args.env_steps * (args.turn_tokens + 16)}", f"data.train_batch_size={args.prompts}",
        f"data.builtin_options.train_size={args.prompts * 4}", "data.builtin_options.val_size=4",
        f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.25", f"trainer.mode={mode}",
        f"async.max_staleness={args.max_staleness}", f"async.num_generators={args.generators}",
        f"async.generator_cpus={args.generator_cpus}", f"async.unit_groups={args.unit_groups or 'null'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{mode} at {latency_ms} ms failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return throughput(run_dir, args.prompts * args.n)


def main() -> None:
    from posttrain.models import cached_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model path or built-in name (default: the tiny test model)")
    parser.add_argument("--latencies", default="0,50,200,500", help="ms per environment step, comma-separated")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--env-steps", type=int, default=3, help="agent turns per episode, each one environment step")
    parser.add_argument("--turn-tokens", type=int, default=16, help="new tokens per agent turn")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--generator-cpus", type=float, default=0.5)
    parser.add_argument("--unit-groups", type=int, default=None,
                        help="prompts per generator call (default: a whole batch, so generators work on different batches)")
    args = parser.parse_args()
    args.model = args.model or str(cached_tiny_model("llama"))
    args.unit_groups = args.unit_groups or args.prompts
    latencies = [float(x) for x in args.latencies.split(",")]
    out = Path(tempfile.mkdtemp(prefix="async-bench-"))
    print(f"model {args.model}; {args.prompts} prompts x {args.n}, {args.env_steps} turns of <= {args.turn_tokens} tokens, {args.steps} steps; "
          f"async: {args.generators} generator(s) x {args.generator_cpus:g} CPU, max_staleness {args.max_staleness}; runs in {out}")
    print(f"{'latency_ms':>10} {'sync_samples/s':>15} {'async_samples/s':>16} {'async/sync':>11}")
    ratios = {}
    for latency in latencies:
        sync, asynchronous = run("sync", latency, args, out), run("async", latency, args, out)
        ratios[latency] = asynchronous / sync
        print(f"{latency:>10.0f} {sync:>15.2f} {asynchronous:>16.2f} {ratios[latency]:>11.2f}", flush=True)
    headline = ratios.get(200.0, next(iter(ratios.values())))
    print(f"async_over_sync_at_200ms: {headline:.2f}")


if __name__ == "__main__":
    main()
