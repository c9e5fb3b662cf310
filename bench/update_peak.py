"""How close the policy update comes to this machine's matmul peak, in the update's own dtype.

The update: the main job's (bench/update.py's batch: SmolLM2-135M-Instruct, 64 sequences, prompts
40-60 tokens, responses 8-64; PPO's clipped loss with entropy, micro-batches of up to 2,048 real
tokens as the main job's preset has them (``--max-tokens 0``: 16 samples), one AdamW step), as
TrainingEngine.train_mini_batch runs it with today's defaults, median of ``--repeats``.
Its work is counted from the model's shapes and the batch's real tokens, forward + backward
(``bench.update.update_flops``: the decoder's dense layers, attention scores, and the LM head on
response tokens); padding, filler and the optimizer count nothing, though their time is in the
update's. The peak: the best of square ``torch.mm`` products (1024-4096) in the same dtype on the
same threads. Both are CPU seconds of this process (``time.process_time``), so a neighbour's load
changes them little.

``--compile``: the headline is a compiled engine's (``actor_rollout_ref.actor.compile=true``: each
decoder layer through torch.compile), timed in turns with the plain engine's; its first update, which
compiles with inductor's on-disk caches off, is printed apart with the updates it takes to win back.

Where the time goes (a per-op profile) is ``bench/update.py``'s; this bench gives the one ratio.
Headline: update_over_matmul_peak = achieved FLOP/s / peak FLOP/s.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config

from bench.train import interleaved_medians, ppo_loss
from bench.update import (
    MICRO_BATCH,
    engine,
    main_task_batch,
    matmul_peak_gflops,
    update_flops,
)
from posttrain import keys
from posttrain.models import resolve_model


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048, 4096), tries: int = 5) -> tuple[float, int]:
    """(best GFLOP/s, its size) of square torch.mm products in ``dtype``, CPU seconds, the best of ``tries`` each.

    One try varied by 7% between runs (199.6 to 213.7 GFLOP/s); the best of several is the rate the
    CPU can reach, so the ratio errs low rather than high.
    """
    return max((matmul_peak_gflops(dtype, size, repeats=3), size) for size in sizes for _ in range(tries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in name or a local HF model directory")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for the update and the peak alike")
    parser.add_argument("--max-tokens", type=int, default=2048,
                        help="micro-batches by this token budget, as the main job's preset (use_dynamic_bsz); 0: 16 samples")
    parser.add_argument("--against-samples", action="store_true",
                        help="also time micro-batches of 16 samples, in turns with the budget's, and print the speedup")
    parser.add_argument("--compile", action="store_true",
                        help="the update of a torch.compile'd engine (compile=true), timed in turns with the plain engine's; "
                             "its first update, compiling with inductor's caches off, is timed apart")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model_dir = str(resolve_model(args.model))
    target = engine(model_dir)
    batch = main_task_batch(args.samples, target.module.config.vocab_size)
    dtype = target.compute_dtype
    flops = update_flops(target.module, batch)
    micro = {"max_tokens": args.max_tokens} if args.max_tokens else {"micro_batch_size": MICRO_BATCH}
    runs = [(target, micro)]  # the first is the headline's
    if args.compile:
        torch._inductor.config.force_disable_caches = True  # the compile time is this run's, not a cache hit's
        runs.insert(0, (engine(model_dir, compile=True), micro))
        start = time.perf_counter()
        runs[0][0].train_mini_batch(batch, ppo_loss, with_entropy=True, **micro)
        first = time.perf_counter() - start
    if args.against_samples and args.max_tokens:
        runs.append((runs[0][0], {"micro_batch_size": MICRO_BATCH}))
    timed = interleaved_medians(
        [lambda e=e, m=m: e.train_mini_batch(batch, ppo_loss, with_entropy=True, **m) for e, m in runs], args.repeats
    )
    wall, cpu = timed[0]
    if args.compile:
        plain_wall, plain_cpu = timed[1]
        print(f"compiled: first update {first:.1f} s wall (compiling), then {cpu:.2f} CPU s against the plain engine's "
              f"{plain_cpu:.2f} (in turns, median of {args.repeats}): {plain_cpu / cpu:.3f}x; the compile is won back after "
              + (f"{(first - wall) / (plain_wall - wall):.0f} updates" if plain_wall > wall else "no number of updates"))
    if args.against_samples and args.max_tokens:
        print(f"micro-batches of {MICRO_BATCH} samples: {timed[-1][1]:.2f} CPU s, of up to {args.max_tokens} tokens: {cpu:.2f} "
              f"(in turns, median of {args.repeats}): {timed[-1][1] / cpu:.3f}x faster by the token budget")
    achieved = sum(flops.values()) / cpu / 1e9
    peak, size = matmul_peak(dtype)
    tokens = int(batch[keys.ATTENTION_MASK].sum())
    shares = ", ".join(f"{name} {value / sum(flops.values()):.0%}" for name, value in flops.items())
    print(f"model {args.model}, {dtype}, {args.threads} thread(s); {args.samples} sequences, {tokens} real tokens; "
          f"micro-batches {micro}{', compiled' if args.compile else ''}")
    print(f"update: {cpu:.2f} CPU s ({wall:.2f} s wall), {sum(flops.values()) / 1e12:.3f} TFLOP fwd+bwd ({shares}): "
          f"{achieved:.1f} GFLOP/s")
    print(f"matmul peak: {peak:.1f} GFLOP/s ({dtype} torch.mm {size}x{size})")
    print(f"update_over_matmul_peak: {achieved / peak:.3f}")


if __name__ == "__main__":
    main()
