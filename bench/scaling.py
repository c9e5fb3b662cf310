"""How a synchronous GRPO step's cost grows with batch size and response length.

The main job's task and model (preset ``arithmetic_grpo``: SmolLM2-135M-Instruct, vLLM, no KL, one
optimizer step per step) through the CLI, for each batch of ``--prompts`` prompts × ``--n`` samples and
each ``--lengths`` cap on new tokens, ``--steps`` steps each (validation off). A step's time is
``timing_s/step`` from metrics.jsonl; the first step (engine warm-up) is left out and the median of
the rest is reported, with its split into generation and update. Every run is in its own process,
one after the other.

Prints a Markdown table (the README's scaling table). The headline is the cost of 4× the prompts
at the shortest length, as a ratio of step times: ``step_time_4x_prompts: <ratio>`` (1 would be free
batching, 4 no batching gain at all).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def step_times(run_dir: Path) -> list[dict[str, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["metrics"] for r in records if r["step"] > 0 and "timing_s/step" in r["metrics"]]


def run(prompts: int, n: int, length: int, steps: int, out: Path) -> dict[str, float]:
    from posttrain.config import load_config, preset_path

    run_dir = out / f"p{prompts}_l{length}"
    micro = load_config([preset_path("arithmetic_grpo")]).actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    # the preset's micro-batch where it divides the batch (a small batch is one micro-batch)
    micro_batch = [] if (prompts * n) % micro == 0 else [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={prompts * n}"]
    command = [
        sys.executable, "-m", "posttrain.cli", "train", "--preset", "arithmetic_grpo", f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1", f"trainer.total_training_steps={steps}",
        f"data.train_batch_size={prompts}", f"data.builtin_options.train_size={prompts * steps}", "data.builtin_options.val_size=4",
        f"data.max_response_length={length}", f"actor_rollout_ref.rollout.n={n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false", *micro_batch,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{prompts} prompts, {length} tokens failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    measured = step_times(run_dir)[1:]  # the first step warms the engines up
    return {key: statistics.median(m.get(key, 0.0) for m in measured) for key in ("timing_s/step", "timing_s/gen", "timing_s/update_actor")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the first is left out (at least 2)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is warm-up")
    results = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-scaling-") as tmp:
        for length in args.lengths:
            for prompts in args.prompts:
                results[prompts, length] = run(prompts, args.n, length, args.steps, Path(tmp))
                r = results[prompts, length]
                print(f"  {prompts} × {args.n}, ≤ {length} tokens: {r['timing_s/step']:.1f} s/step", flush=True)
    print("\n| prompts × n | ≤ new tokens | s/step | generation | actor update | s per sample |\n|---|---|---|---|---|---|")
    for (prompts, length), r in results.items():
        print(f"| {prompts} × {args.n} | {length} | {r['timing_s/step']:.1f} | {r['timing_s/gen']:.1f} | "
              f"{r['timing_s/update_actor']:.1f} | {r['timing_s/step'] / (prompts * args.n):.2f} |")
    shortest, fewest, most = min(args.lengths), min(args.prompts), max(args.prompts)
    ratio = results[most, shortest]["timing_s/step"] / results[fewest, shortest]["timing_s/step"]
    print(f"\n{most}/{fewest} = {most / fewest:.0f}× the prompts at ≤ {shortest} tokens costs {ratio:.2f}× the step time")
    print(f"step_time_{most // fewest}x_prompts: {ratio:.3f}")


if __name__ == "__main__":
    main()
