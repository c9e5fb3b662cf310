"""Long runs: host memory growth over a 200-step run, and what is left behind at its end.

For each mode in ``--modes`` (sync, async) a run of ``--steps`` steps trains the tiny model on the
built-in arithmetic task with the HF rollout engine, in this process (the trainer is the CLI's), while
a thread samples the resident memory of this process and every process under it (Ray's raylet and
object store, the workers) four times a second. Per step it keeps the largest sample, so every step is
seen at the same phase (its peak); growth is the median of those peaks over steps
[late - 10, late) divided by the median over [early, early + 10), with early = 20 and late = the last
step.

At the end of each run, before Ray shuts down: Ray actors still alive and objects still in the object
store (the trainer has released its workers by then); after ``ray.shutdown()`` and a grace period:
child processes still alive. Each should be 0.

The last line is ``soak_memory_growth: <ratio>``, the larger of the modes' ratios (target <= 1.05).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import psutil

from bench.common import MemorySampler, peak_growth

EARLY_STEP = 20
WINDOW = 10
GRACE_S = 10.0


def ray_leftovers(grace_s: float) -> tuple[int, int, float]:
    """Actors alive, objects in the object store and their MiB, on the running Ray, once they stop
    falling (Ray frees objects and ends actors asynchronously) or after ``grace_s`` seconds."""
    import ray
    from ray._private import state
    from ray._private.internal_api import memory_summary

    deadline = time.monotonic() + grace_s
    while True:
        alive = sum(1 for actor in state.actors().values() if actor["State"] != "DEAD")
        summary = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
        match = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", summary)
        mib, objects = (float(match.group(1)), int(match.group(2))) if match else (float("nan"), -1)
        if (alive == 0 and objects == 0) or time.monotonic() > deadline:
            return alive, objects, mib
        time.sleep(0.5)


def children_left(grace_s: float, ignore: Collection[int] = ()) -> list[str]:
    """This process's descendants still alive after ``grace_s`` seconds, but for Python's own
    multiprocessing resource tracker (one per interpreter, started by the first spawned child: it
    ends with this process by design) and the pids in ``ignore`` (what ran before, e.g. a test's)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in ignore and _counts(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    names = []
    for process in alive:
        try:
            names.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
        except psutil.Error:
            pass
    return names


def _counts(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE and "multiprocessing.resource_tracker" not in " ".join(process.cmdline())
    except psutil.Error:
        return False


def soak(mode: str, steps: int, model: str, out: Path) -> dict[str, float]:
    import ray

    from posttrain.config import load_config, preset_path
    from posttrain.cli.train import start_ray
    from posttrain.trainer.modes import training_run

    config = load_config([preset_path("arithmetic_grpo")], [
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf", f"trainer.default_local_dir={out / mode}",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1", f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000", "data.train_batch_size=4", "data.builtin_options.train_size=64", "data.builtin_options.val_size=4",
        "data.max_response_length=16", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", f"trainer.mode={mode}", "trainer.save_freq=50",
        "trainer.max_ckpt_to_keep=1",
    ])
    trainer = training_run(config)
    start_ray(config.trainer, trainer.run_dir)
    sampler = MemorySampler(lambda: trainer.step)
    sampler.start()
    try:
        trainer.fit()
        sampler.done.set()
        sampler.join()
        actors, objects, object_mib = ray_leftovers(GRACE_S)
    finally:
        sampler.done.set()
        ray.shutdown()
    left = children_left(GRACE_S)
    for line in left:
        print(f"  {mode}: process left: {line}")
    last = max(sampler.peaks)
    early, late, growth = peak_growth(sampler.peaks, range(EARLY_STEP, EARLY_STEP + WINDOW), range(last - WINDOW, last))
    return {
        "early_mib": early / 2**20, "late_mib": late / 2**20, "growth": growth, "actors": actors, "objects": objects,
        "object_mib": object_mib, "processes": len(left), "last_step": last,
    }


def main() -> None:
    from posttrain.models import cached_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--model", default=None, help="a model directory (default: the tiny llama test model)")
    args = parser.parse_args()
    if args.steps < EARLY_STEP + 2 * WINDOW:
        parser.error(f"--steps must be at least {EARLY_STEP + 2 * WINDOW} (growth compares steps {EARLY_STEP}.. with the last {WINDOW})")
    model = args.model or str(cached_tiny_model("llama"))
    results = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-soak-") as tmp:
        for mode in args.modes:
            started = time.perf_counter()
            results[mode] = soak(mode, args.steps, model, Path(tmp))
            r = results[mode]
            print(f"{mode}: {r['last_step']} steps in {time.perf_counter() - started:.0f} s; host memory (peak per step) "
                  f"{r['early_mib']:.0f} MiB at steps {EARLY_STEP}-{EARLY_STEP + WINDOW - 1} -> {r['late_mib']:.0f} MiB at the last "
                  f"{WINDOW}: growth {r['growth']:.3f}; left at the end: {r['actors']} actors, {r['objects']} objects "
                  f"({r['object_mib']:.0f} MiB), {r['processes']} processes", flush=True)
    leaks = sum(r["actors"] + max(r["objects"], 0) + r["processes"] for r in results.values())
    print(f"leaked (actors + objects + processes, all modes): {leaks}")
    print(f"soak_memory_growth: {max(r['growth'] for r in results.values()):.3f}")
    sys.exit(0)


if __name__ == "__main__":
    main()
