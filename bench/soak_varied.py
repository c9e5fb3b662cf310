"""The policy worker's memory over many steps of varied shapes: does its peak stay flat?

One :class:`~posttrain.workers.policy.PolicyWorker`, in this process, runs ``--cycles`` cycles of
what a TextArena GRPO step asks of it (``posttrain/config/presets/textarena_grpo.yaml``, on the real
SmolLM2-135M-Instruct, in the preset's settings: sdpa attention, bf16 autocast where the CPU has it,
dynamic micro-batches of up to 4,096 tokens, vLLM on CPU):

  update    one optimizer step on ``--samples`` samples (prompts of 140-160 tokens, responses of
            100-1,300, drawn anew each cycle from a fixed seed, as episodes vary); 2 by default, which
            fits 30 cycles in 25 minutes on 2 cores; ``--samples 8`` is a whole group (the preset's
            step has 64: eight groups of 8), about 4x the time
  reload    the new weights into vLLM in place (``sync_weights``: vLLM's ``reload_weights``)
  generate  a short generation (8 prompts, 16 new tokens)

``--phases`` runs only some of them (to find which one grows). A thread samples this process's
resident memory four times a second and keeps each cycle's peak; growth is the median peak of the
last 10 cycles over the median peak of cycles 5-15. ``--glibc-default`` starts the cycles without
``posttrain.controller.memory.limit_heap_growth`` (the fix), to show the figure before it.

The last line is ``soak_varied_memory_growth: <ratio>`` (target <= 1.05).
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import MemorySampler, chat_prompt_ids, peak_growth
from posttrain import keys
from posttrain.config.schema import ActorConfig, DataConfig, ModelConfig, OptimConfig, RolloutConfig
from posttrain.controller import WorkerContext
from posttrain.controller.memory import heap_gb, limit_heap_growth, resident_gb
from posttrain.engines.rollout import GenerationParams
from posttrain.engines.training.inputs import random_model_inputs
from posttrain.protocol import Batch
from posttrain.workers.policy import PolicyWorker

MAX_PROMPT, MAX_RESPONSE = 192, 1280  # the preset's data.max_prompt_length, data.max_response_length
EARLY, LATE = range(5, 16), 10  # cycles 5-15; the last 10


def varied_batch(cycle: int, samples: int, vocab: int) -> Batch:
    """A group's update batch with TextArena's spread of lengths, the same for the same ``cycle``."""
    generator = torch.Generator().manual_seed(cycle)
    prompt_lengths = torch.randint(140, 161, (samples,), generator=generator)
    response_lengths = torch.randint(100, 1301, (samples,), generator=generator)
    tensors = random_model_inputs(prompt_lengths, response_lengths, MAX_PROMPT, MAX_RESPONSE, vocab_size=vocab, generator=generator)
    tensors[keys.ADVANTAGES] = torch.randn(samples, MAX_RESPONSE, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(samples, MAX_RESPONSE, generator=generator) - 8.0
    return Batch.from_dict(tensors)


def policy_worker(model: str, samples: int) -> PolicyWorker:
    """The preset's policy worker (one optimizer step per update, as one mini-batch of ``samples``)."""
    actor = ActorConfig(ppo_mini_batch_size=samples, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4096,
                        attn_implementation="sdpa", loss_agg_mode="token-mean", optim=OptimConfig(lr=1e-5))
    return PolicyWorker(WorkerContext(), ModelConfig(path=model), actor, RolloutConfig(n=1, temperature=1.0),
                        DataConfig(max_prompt_length=MAX_PROMPT, max_response_length=MAX_RESPONSE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in name or a local HF model directory")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--samples", type=int, default=2, help="samples per update (the preset's: 64, eight groups of 8; 2 fits 30 cycles in 25 min here)")
    parser.add_argument("--phases", nargs="+", default=["update", "reload", "generate"], choices=["update", "reload", "generate"])
    parser.add_argument("--glibc-default", action="store_true", help="without the fix (posttrain.controller.memory.limit_heap_growth)")
    args = parser.parse_args()
    if args.cycles < EARLY.stop - 1 + LATE:
        parser.error(f"--cycles must be at least {EARLY.stop - 1 + LATE} (growth compares cycles {EARLY.start}-{EARLY.stop - 1} with the last {LATE})")

    if not args.glibc_default:
        limit_heap_growth()  # as every worker process does before it builds its engines
    worker = policy_worker(args.model, args.samples)
    prompts = chat_prompt_ids(worker.tokenizer, 8)
    params = GenerationParams(max_new_tokens=16, temperature=1.0, seed=0)
    cycle = 0
    sampler = MemorySampler(lambda: cycle)
    sampler.start()
    started, seconds = time.perf_counter(), {phase: 0.0 for phase in args.phases}
    for cycle in range(1, args.cycles + 1):
        batch = varied_batch(cycle, args.samples, worker.engine.module.config.vocab_size)
        for phase in args.phases:
            start = time.perf_counter()
            if phase == "update":
                worker.update(batch)
            elif phase == "reload":
                worker.sync_weights(cycle)
            else:
                worker.rollout.generate(prompts, params)
            seconds[phase] += time.perf_counter() - start
        time.sleep(2 * sampler.period_s)  # the cycle's last sample is taken before the next begins
        heap = heap_gb()
        print(f"cycle {cycle}: peak {sampler.peaks.get(cycle, 0) / 2**30:.2f} GiB, at its end {resident_gb():.2f} GB"
              + (f" (heap in use {heap[0]:.3f} GB, free {heap[1]:.3f})" if heap else "")
              + f", {int(batch[keys.ATTENTION_MASK].sum())} tokens, {time.perf_counter() - started:.0f} s so far", flush=True)
    sampler.done.set()
    early, late, growth = peak_growth(sampler.peaks, EARLY, range(args.cycles - LATE + 1, args.cycles + 1))
    print(f"{args.cycles} cycles ({' + '.join(args.phases)}; " + ", ".join(f"{p} {s / args.cycles:.1f} s" for p, s in seconds.items())
          + f" a cycle) in {time.perf_counter() - started:.0f} s; peak resident memory {early / 2**30:.2f} GiB at cycles "
          f"{EARLY.start}-{EARLY.stop - 1} -> {late / 2**30:.2f} GiB at the last {LATE}")
    print(f"soak_varied_memory_growth: {growth:.3f}")


if __name__ == "__main__":
    main()
