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
Both engines live in this process and update in turns, the order alternating each round, after a
warm-up update each; medians of ``--repeats`` updates. Printed: each one's time and its peak GPU
memory above what was allocated before the update (``torch.cuda.max_memory_allocated``: the update's
own memory, its activations, logits and gradients, beside both engines' weights and optimizer state).
Needs an NVIDIA GPU. Headline: fsdp_update_memory_fused_over_plain, the update's own memory (the peak
above what was allocated before it), fused over plain (lower is better).
"""

from __future__ import annotations

import argparse
import contextlib
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


def one_update(engine: TrainingEngine, batch, micro_batch: int, plain: bool) -> tuple[float, float]:
    """(seconds, GiB above what was allocated before) of one update."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with models_own_head() if plain else contextlib.nullcontext():
        engine.train_mini_batch(batch, ppo_loss, micro_batch_size=micro_batch)
    torch.cuda.synchronize()
    return time.perf_counter() - start, (torch.cuda.max_memory_allocated() - before) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=6)
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
            engines = {name: TrainingEngine(config) for name in ("plain", "fused")}
            for name, engine in engines.items():  # warm-up
                one_update(engine, batch, args.micro_batch, plain=name == "plain")
            seconds, rises = {name: [] for name in engines}, {name: [] for name in engines}
            for round_index in range(args.repeats):
                for name in list(engines)[:: 1 if round_index % 2 == 0 else -1]:
                    took, rise = one_update(engines[name], batch, args.micro_batch, plain=name == "plain")
                    seconds[name].append(took)
                    rises[name].append(rise)
        finally:
            dist.destroy_process_group()
    tokens = args.samples * (args.prompt + args.response)
    print(f"{torch.cuda.get_device_name()}; {args.samples} samples x ({args.prompt} + {args.response}) tokens "
          f"({tokens} tokens), micro-batches of {args.micro_batch}, bf16, FSDP2 (1 rank)")
    time_of = {name: statistics.median(values) for name, values in seconds.items()}
    memory_of = {name: max(values) for name, values in rises.items()}
    for name in ("plain", "fused"):
        print(f"{name}: {time_of[name]:.3f} s an update, peak {memory_of[name]:.2f} GiB above the weights and optimizer state")
    print(f"time fused/plain: {time_of['fused'] / time_of['plain']:.3f}")
    print(f"fsdp_update_memory_fused_over_plain: {memory_of['fused'] / memory_of['plain']:.3f}")


if __name__ == "__main__":
    main()
