"""The policy update's throughput: the engine before issue 24 against today's, same tokens, one run.

The main job's update (SmolLM2-135M-Instruct, 64 sequences, prompts 40-60 tokens, responses 8-64,
left/right padded; PPO's clipped loss with entropy, micro-batches of 16; one optimizer step), as
TrainingEngine.train_mini_batch runs it, in the engine's compute dtype:
  before: padded rows cut to the micro-batch's attended columns, and the model's own LM head on the
          response columns, then the chunked log-softmax (the engine before issue 24);
  after:  today's defaults: packed rows (each sample's real tokens, several to a row), and the LM
          head fused with the log-softmax on scored tokens only (posttrain.algos.head_logprobs).
Both use eager attention and fused AdamW. Both engines run in this process in turns, the order
alternating (bench.train.interleaved_medians). Throughput is real (attended) tokens per CPU second
of this process (``time.process_time``), so a neighbour's load on a shared machine changes it
little; ``--threads`` (default 1) sets torch's pool.

Also printed, from the same run:
  peak:    a large torch.mm in the compute dtype (the matmul rate this CPU reaches, GFLOP/s);
  achieved fwd+bwd GFLOP/s of the after engine, counting useful work only (real tokens):
             dense  6 * N_layers_params * real tokens       (N: the decoder layers' parameters)
             attn   12 * n_layers * d_model * sum_i L_i^2   (QK^T and PV, 2 matmuls x 2 FLOP, x3 fwd+bwd)
             head   6 * d_model * vocab * response tokens   (the LM head runs on response tokens only)
  profile: one after update under torch.profiler, self CPU time grouped: matmul/linear, attention,
           LM head + log-softmax (matmuls with a vocabulary-sized side, softmax ops), optimizer
           (AdamW, gradient norm), other (norms, activations, rotary, casts, copies);
  micro-batches (``--sweep``): the after engine under other micro-batch sizes and token budgets;
  compile (``--compile``): a torch.compile'd after engine: its compile time (first update's wall time
           over a steady one's), its steady speedup, and the updates it takes to win the compile back.
Memory: two engines and, with ``--sweep``, micro-batches of up to 4,096 tokens: ~14 GiB at the peak.
Headline: update_speedup = after / before, tokens per CPU second.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

import torch
import torch._inductor.config

from bench.train import fresh_memory, interleaved_medians, ppo_loss
from posttrain import keys
from posttrain.engines.training import TrainingEngine, TrainingEngineConfig
from posttrain.engines.training import modeling
from posttrain.engines.training.inputs import random_model_inputs
from posttrain.models import resolve_model
from posttrain.protocol import Batch

MICRO_BATCH = 16


def main_task_batch(samples: int, vocab: int, seed: int = 1) -> Batch:
    """64 sequences shaped like the main job's: prompts 40-60 tokens, responses 8-64, random ids."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(40, 61, (samples,), generator=generator)
    response_lengths = torch.randint(8, 65, (samples,), generator=generator)
    tensors = random_model_inputs(prompt_lengths, response_lengths, 60, 64, vocab_size=vocab, generator=generator)
    tensors[keys.ADVANTAGES] = torch.randn(samples, 64, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(samples, 64, generator=generator) - 8.0
    return Batch.from_dict(tensors)


def engine(model_dir: str, *, before: bool = False, compile: bool = False) -> TrainingEngine:
    config = TrainingEngineConfig(model_path=model_dir, lr=1e-6, device="cpu", compile=compile, pack_sequences=not before)
    result = TrainingEngine(config)
    fresh_memory(result.module)
    return result


@contextlib.contextmanager
def models_own_head() -> Iterator[None]:
    """The model's own LM head on the response columns, then the chunked log-softmax (before issue 24)."""
    saved = modeling.plain_head
    modeling.plain_head = lambda model: None
    try:
        yield
    finally:
        modeling.plain_head = saved


def matmul_peak_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    start = time.process_time()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.process_time() - start) / 1e9


def update_flops(model: torch.nn.Module, batch: Batch) -> dict[str, float]:
    """Useful FLOPs of one forward + backward (the module docstring's formulas)."""
    config = model.config
    layer_params = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name)
    lengths = batch[keys.ATTENTION_MASK].sum(dim=1).double()
    return {
        "dense": 6.0 * layer_params * float(lengths.sum()),
        "attn": 12.0 * config.num_hidden_layers * config.hidden_size * float((lengths**2).sum()),
        "head": 6.0 * config.hidden_size * config.vocab_size * float(batch[keys.RESPONSE_MASK].sum()),
    }


def op_group(event, vocab: int, in_optimizer: bool) -> str:
    name = event.key if hasattr(event, "key") else event.name
    shapes = getattr(event, "input_shapes", None) or []
    if in_optimizer or "Optimizer" in name or "vector_norm" in name or "_foreach" in name or "adam" in name.lower():
        return "optimizer"
    if "attention" in name or "scaled_dot_product" in name or any(len(s) == 4 for s in shapes if s) and name in (
            "aten::bmm", "aten::matmul", "aten::_softmax", "aten::_softmax_backward_data"):
        return "attention"
    if any(vocab in s for s in shapes if s) or "Chunked" in name:
        return "lm head + log_softmax"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"):
        return "matmul/linear"
    return "other"


def grouped_profile(target: TrainingEngine, batch: Batch) -> dict[str, float]:
    """Self CPU seconds per op group of one update (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    vocab = target.module.config.vocab_size
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        target.train_mini_batch(batch, ppo_loss, micro_batch_size=MICRO_BATCH, with_entropy=True)
    events = list(prof.events())
    steps = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith("Optimizer.")]
    groups: dict[str, float] = {}
    for event in events:
        inside = any(start <= event.time_range.start and event.time_range.end <= end for start, end in steps)
        group = op_group(event, vocab, inside)
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total / 1e6
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in name or a local HF model directory")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is stable on a shared 2-core machine)")
    parser.add_argument("--sweep", action="store_true", help="also time other micro-batch sizes and token budgets")
    parser.add_argument("--compile", action="store_true", help="also time a torch.compile'd engine (minutes)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model_dir = str(resolve_model(args.model))
    before, after = engine(model_dir, before=True), engine(model_dir)
    batch = main_task_batch(args.samples, after.module.config.vocab_size)
    tokens = int(batch[keys.ATTENTION_MASK].sum())
    dtype = after.compute_dtype
    print(f"model: {args.model}, compute dtype {dtype}, {args.threads} thread(s); {args.samples} sequences, {tokens} real "
          f"tokens ({int(batch[keys.RESPONSE_MASK].sum())} response), micro-batches of {MICRO_BATCH}; median of {args.repeats}")

    def update(target: TrainingEngine, **micro) -> None:
        with models_own_head() if target is before else contextlib.nullcontext():
            target.train_mini_batch(batch, ppo_loss, with_entropy=True, **(micro or {"micro_batch_size": MICRO_BATCH}))

    (before_wall, before_cpu), (after_wall, after_cpu) = interleaved_medians(
        [lambda: update(before), lambda: update(after)], args.repeats)
    print(f"tokens per CPU second: before {tokens / before_cpu:.0f} (padded rows, the model's own head), after {tokens / after_cpu:.0f} "
          f"(packed rows, fused head); per wall second {tokens / before_wall:.0f} vs {tokens / after_wall:.0f}")

    peak = matmul_peak_gflops(dtype)
    flops = update_flops(after.module, batch)
    achieved = sum(flops.values()) / after_cpu / 1e9
    shares = ", ".join(f"{name} {value / sum(flops.values()):.0%}" for name, value in flops.items())
    print(f"fwd+bwd useful work {sum(flops.values()) / 1e12:.2f} TFLOP ({shares}); achieved {achieved:.1f} GFLOP/s per "
          f"CPU second against a {dtype} torch.mm peak of {peak:.1f}: {achieved / peak:.0%} of peak")

    groups = grouped_profile(after, batch)
    total = sum(groups.values())
    print("profile of one after update, self CPU time: " + ", ".join(
        f"{name} {seconds:.2f} s ({seconds / total:.0%})" for name, seconds in sorted(groups.items(), key=lambda kv: -kv[1])))

    if args.sweep:
        # Micro-batches of 64 samples take ~12 GiB here; the sweep stays below.
        settings = [{"micro_batch_size": size} for size in (8, 16, 32)] + [{"max_tokens": budget} for budget in (1024, 2048, 4096)]
        timed = interleaved_medians([lambda s=s: update(after, **s) for s in settings], max(1, args.repeats - 1))
        print("micro-batching, after engine, tokens per CPU second: " + ", ".join(
            f"{next(iter(s))}={next(iter(s.values()))}: {tokens / cpu:.0f}" for s, (_, cpu) in zip(settings, timed)))

    if args.compile:
        torch._inductor.config.force_disable_caches = True  # the compile time is this run's, not a cache hit's
        compiled = engine(model_dir, compile=True)
        start = time.perf_counter()
        update(compiled)
        first = time.perf_counter() - start
        (_, plain_cpu), (compiled_wall, compiled_cpu) = interleaved_medians(
            [lambda: update(after), lambda: update(compiled)], args.repeats)
        saved = after_wall - compiled_wall
        payback = f"wins it back after {(first - compiled_wall) / saved:.0f} updates" if saved > 0 else "never wins it back"
        print(f"compile: first update {first:.0f} s wall (compiling), then {plain_cpu / compiled_cpu:.3f}x the after engine's "
              f"tokens per CPU second; {payback} (a new micro-batch shape may compile again)")

    print(f"update_speedup: {before_cpu / after_cpu:.3f}")


if __name__ == "__main__":
    main()
