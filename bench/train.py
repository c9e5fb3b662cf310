"""Policy-update throughput: the training engine against a plain PyTorch loop on the same tokens.

One PPO mini-batch update (clipped surrogate, token-mean with the global normaliser, from
posttrain.algos) of 8 sequences, split into micro-batches of 4, bf16 autocast, on SmolLM2-135M-Instruct
(``--model small`` for an 8M-parameter llama that runs in seconds, or any local model directory):
  ours:     TrainingEngine.train_mini_batch: Batch checks, micro-batch split, each micro-batch packed
            to its real tokens, the LM head fused with the chunked logprobs on response tokens only
            (posttrain.algos.head_logprobs),
            the loss, backward, clipping with the norm reported, finite check, AdamW, schedule, metrics.
  baseline: what a careful user writes by hand: the same model class, the same AdamW and autocast,
            per micro-batch HF forward with logits_to_keep on the response positions, float32
            log_softmax + gather, the same loss function, backward; then clip_grad_norm_ and step.
Both run in this process in turns, the order alternating each round (a change in machine load, or
running second, hits both alike); median of repeats. Throughput is tokens per CPU second of this
process (``time.process_time``, one torch thread by default): on a shared 2-core machine wall time
mostly measures the neighbours' load. Wall-clock ratios are printed beside it. Both models are
copied into fresh memory first (see ``fresh_memory``). Resolution: two identical plain loops
measure within ~3% of each other here.

The headline batch has no padding (every prompt and response at full length), so its ratio is the
engine's overhead alone. ``--ragged`` adds a batch of random lengths, where the engine also skips
padding that the baseline computes. Headline: ours / baseline, tokens per CPU second (target >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain import keys
from posttrain.algos import loss_normalizer, ppo_policy_loss
from posttrain.engines.training import TrainingEngine, TrainingEngineConfig
from posttrain.engines.training.inputs import random_model_inputs
from posttrain.models import load_causal_lm, resolve_dtype, resolve_model
from posttrain.protocol import Batch

MICRO_BATCH = 4


def make_model(out_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=1024, max_position_embeddings=1024)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out_dir)
    return out_dir


def make_batch(size: int, prompt: int, response: int, vocab: int, ragged: bool) -> Batch:
    """Random ids; lengths random (ragged) or all full; PPO's advantages and old logprobs."""
    generator = torch.Generator().manual_seed(1)
    if ragged:
        prompt_lengths = torch.randint(prompt // 4, prompt + 1, (size,), generator=generator)
        response_lengths = torch.randint(1, response + 1, (size,), generator=generator)
    else:
        prompt_lengths, response_lengths = torch.full((size,), prompt), torch.full((size,), response)
    tensors = random_model_inputs(prompt_lengths, response_lengths, prompt, response, vocab_size=vocab, generator=generator)
    tensors[keys.ADVANTAGES] = torch.randn(size, response, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(size, response, generator=generator) - 8.0
    return Batch.from_dict(tensors)


def ppo_loss(outputs, micro_batch: Batch, global_normalizer: torch.Tensor):
    result = ppo_policy_loss(outputs.logprobs, micro_batch[keys.OLD_LOGPROBS], micro_batch[keys.ADVANTAGES],
                             micro_batch[keys.RESPONSE_MASK], global_normalizer=global_normalizer)
    return result.loss, {"pg_clipfrac": result.clipfrac}


class PlainLoop:
    """The hand-written baseline (module docstring)."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, lr: float) -> None:
        self.model = load_causal_lm(model_dir, dtype=torch.float32).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.dtype = dtype

    def step(self, batch: Batch) -> None:
        response_length = batch[keys.RESPONSE_IDS].shape[1]
        normalizer = loss_normalizer(batch[keys.RESPONSE_MASK], "token-mean")
        for micro in batch.split(MICRO_BATCH):
            with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
                logits = self.model(input_ids=micro[keys.INPUT_IDS], attention_mask=micro[keys.ATTENTION_MASK],
                                    position_ids=micro[keys.POSITION_IDS], use_cache=False,
                                    logits_to_keep=response_length + 1).logits[:, :-1]
            log_softmax = torch.log_softmax(logits.float(), dim=-1)
            logprobs = log_softmax.gather(-1, micro[keys.RESPONSE_IDS].unsqueeze(-1)).squeeze(-1)
            loss = ppo_policy_loss(logprobs, micro[keys.OLD_LOGPROBS], micro[keys.ADVANTAGES],
                                   micro[keys.RESPONSE_MASK], global_normalizer=normalizer).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def fresh_memory(model: torch.nn.Module) -> None:
    """Copy every parameter into newly allocated memory.

    Two models loaded from the same safetensors file start out mapping the same page-cache pages,
    and which one later gets which kind of page differs: two identical plain loops measured 3-16%
    apart in one process until both were copied like this (then within ~3%).
    """
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()


def interleaved_medians(fns: list[Callable[[], None]], repeats: int) -> list[tuple[float, float]]:
    """(wall, CPU) median seconds of each function, run in turns, the order reversed every other round."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[tuple[float, float]]] = [[] for _ in fns]
    for round_index in range(repeats):
        order = list(range(len(fns)))
        for i in order if round_index % 2 == 0 else order[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            fns[i]()
            times[i].append((time.perf_counter() - wall, time.process_time() - cpu))
    return [(statistics.median(t[0] for t in bucket), statistics.median(t[1] for t in bucket)) for bucket in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="'small' (an 8M llama made here), a built-in name or a local HF model directory")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ragged", action="store_true", help="also measure a batch of random lengths")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is stable on a shared 2-core machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.model == "small":
        model_dir = make_model(Path(tempfile.mkdtemp(prefix="bench-train-")))
    else:
        model_dir = resolve_model(args.model)
    engine = TrainingEngine(TrainingEngineConfig(model_path=str(model_dir), dtype=args.dtype, lr=1e-6, device="cpu"))
    plain = PlainLoop(model_dir, resolve_dtype(args.dtype, torch.device("cpu")), lr=1e-6)
    for model in (engine.module, plain.model):
        fresh_memory(model)
    vocab = engine.module.config.vocab_size
    print(f"model: {model_dir.name}, {sum(p.numel() for p in plain.model.parameters()) / 1e6:.1f}M parameters, "
          f"{args.dtype}, {args.threads} thread(s); mini-batch {args.batch} x ({args.prompt} + {args.response}), "
          f"micro-batches of {MICRO_BATCH}; median of {args.repeats}")
    ratios = {}
    for name, ragged in ((("ragged", True),) if args.ragged else ()) + (("full", False),):
        batch = make_batch(args.batch, args.prompt, args.response, vocab, ragged)
        tokens = int(batch[keys.ATTENTION_MASK].sum())
        (ours_wall, ours_cpu), (plain_wall, plain_cpu) = interleaved_medians(
            [lambda: engine.train_mini_batch(batch, ppo_loss, micro_batch_size=MICRO_BATCH), lambda: plain.step(batch)],
            args.repeats,
        )
        ratios[name] = plain_cpu / ours_cpu
        print(f"{name:6s} batch, {tokens} real tokens, tokens per CPU second: engine {tokens / ours_cpu:.0f}, "
              f"plain loop {tokens / plain_cpu:.0f}, ratio {ratios[name]:.3f} "
              f"(per wall second: {tokens / ours_wall:.0f} vs {tokens / plain_wall:.0f}, ratio {plain_wall / ours_wall:.3f})")
    print(f"train_throughput_ratio: {ratios['full']:.3f}")


if __name__ == "__main__":
    main()
