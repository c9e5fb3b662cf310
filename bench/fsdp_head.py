"""The update under FSDP2 on one GPU: the fused LM head against the model's own logits, one run.

One PPO mini-batch update (``TrainingEngine.train_mini_batch``: packed rows, bf16, FSDP2 over a
one-rank NCCL group, micro-batches of ``--micro-batch`` samples) on a llama with SmolLM2-135M's
shapes (30 layers, hidden 576, vocabulary 49,152, tied embeddings; random weights, since time and
memory do not depend on their values), each sample a ``--prompt``-token prompt and a
``--response``-token response:
  fused: today's engine: the head's weight, gathered by the root's forward, goes through
         ``posttrain.algos.head_logprobs`` chunk by chunk (no (tokens x vocabulary) logits);
  plain: the same engine with the fused head turned off (``modeling.plain_head`` returns None), so
         the model's own head makes the logits of the scored columns, as FSDP2 did before.
Both engines run in this process one after the other (plain first; the first is freed, and checked
to be, before the second is built), a warm-up update first; medians of ``--repeats`` updates. Printed:
each one's peak GPU memory (``torch.cuda.max_memory_allocated`` during one update), the peak above
what was allocated before the update (the update's own memory: activations, logits, gradients), and
its time.
Needs an NVIDIA GPU. Headline: fsdp_update_memory_fused_over_plain, the update's own memory (the peak
above what was allocated before it), fused over plain (lower is better).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from bench.train import make_batch, ppo_loss
from bench.update import models_own_head
from posttrain.engines.training import TrainingEngine, TrainingEngineConfig


def smollm2_shaped_model(out_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out_dir)
    return out_dir


def measure(engine: TrainingEngine, batch, micro_batch: int, repeats: int, plain: bool) -> tuple[float, float, float]:
    """(median seconds, peak GiB, peak GiB above what was allocated before the update) of one update, after a warm-up."""
    times, peaks, rises = [], [], []
    for round_index in range(repeats + 1):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        with models_own_head() if plain else contextlib.nullcontext():
            engine.train_mini_batch(batch, ppo_loss, micro_batch_size=micro_batch)
        torch.cuda.synchronize()
        if round_index:
            times.append(time.perf_counter() - start)
            peaks.append(torch.cuda.max_memory_allocated() / 2**30)
            rises.append((torch.cuda.max_memory_allocated() - before) / 2**30)
    return statistics.median(times), max(peaks), max(rises)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/fsdp_head.py needs an NVIDIA GPU (FSDP2 over NCCL)")
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1,
                                timeout=timedelta(seconds=300))
        try:
            model_dir = smollm2_shaped_model(Path(tmp) / "model")
            batch = make_batch(args.samples, args.prompt, args.response, vocab=49152, ragged=False)
            config = TrainingEngineConfig(model_path=str(model_dir), dtype="bfloat16", device="cuda", strategy="fsdp",
                                          attn_implementation="sdpa", lr=1e-6)
            results, baseline = {}, torch.cuda.memory_allocated()
            for name in ("plain", "fused"):
                engine = TrainingEngine(config)
                results[name] = measure(engine, batch, args.micro_batch, args.repeats, plain=name == "plain")
                del engine
                gc.collect()  # FSDP2's hooks hold the module in reference cycles
                torch.cuda.empty_cache()
                left = (torch.cuda.memory_allocated() - baseline) / 2**30
                if left > 0.01:
                    print(f"note: {left:.2f} GiB of the {name} engine stayed allocated; the next engine's peak counts it, its rise does not")
        finally:
            dist.destroy_process_group()
    tokens = args.samples * (args.prompt + args.response)
    print(f"{torch.cuda.get_device_name()}; {args.samples} samples x ({args.prompt} + {args.response}) tokens "
          f"({tokens} tokens), micro-batches of {args.micro_batch}, bf16, FSDP2 (1 rank)")
    for name, (seconds, peak, rise) in results.items():
        print(f"{name}: {seconds:.3f} s an update, peak {peak:.2f} GiB ({rise:.2f} GiB above the weights and optimizer state)")
    print(f"time fused/plain: {results['fused'][0] / results['plain'][0]:.3f}")
    print(f"peak fused/plain: {results['fused'][1] / results['plain'][1]:.3f}")
    print(f"fsdp_update_memory_fused_over_plain: {results['fused'][2] / results['plain'][2]:.3f}")


if __name__ == "__main__":
    main()
