"""A group's prompt computed once: the shared-prompt layout against packing each sample, same batches, one run.

The same Batch goes through two training engines that differ only in ``share_prompt``
(``posttrain.engines.training.packing``): off, every sample carries its own copy of the prompt (the
packed layout); on, the samples of a micro-batch that share a prompt run it once, their responses
after it. Same model (SmolLM2-135M-Instruct), weights, dtype (the engine's ``auto``: bf16 autocast
where native), attention implementation and micro-batching on both sides. Per shape:
  tokens:   tokens the model computes in one update (sum over micro-batches), and their ratio;
  update:   one ``train_mini_batch`` (PPO's clipped loss with entropy, the preset's micro-batching),
            median CPU seconds of this process over ``--repeats``, the engines in turns (order
            alternating: ``bench.train.interleaved_medians``);
  logprobs: one ``compute_logprobs`` pass (micro-batches of the preset's log-prob size), the same way;
  memory:   peak resident memory above the model's during one update, each path in a fresh process
            (``--memory-shapes``, bfcl@4 by default: each costs two more model loads and updates).
Shapes:
  bfcl@4, bfcl@8: 8 prompts (``--prompts``) drawn from ``posttrain prepare bfcl``'s training rows within the
            preset's cap of 768 tokens (their functions in the prompt, as ``bfcl_grpo`` renders them),
            4 or 8 samples each,
            micro-batches of 4 samples (the preset's; ``bfcl@8/8``: of 8, a whole group; ``bfcl@8/t4096``: by a
            budget of 4,096 tokens, ``use_dynamic_bsz``'s default, which each path fills with what it computes),
            sdpa (the preset's). Response lengths: no
            recorded bfcl_grpo rollout is on this machine, so they are drawn uniformly from 20-60
            tokens (the recipe's RL responses averaged ~40: docs/bfcl_runs.md); ``--response-lengths``
            takes a file of recorded lengths (one integer per line) instead.
  main:     the main job's (``arithmetic_grpo``): 8 prompts of 40-60 tokens, 8 samples each,
            responses of 8-48 tokens, micro-batches by a 2,048-token budget, eager (CPU's default).
Also printed: the bf16 spread. The packed path against itself when the micro-batch contents change
(micro-batches of 4 against of 16 samples), and the shared path against the packed one: the largest
per-token log-prob difference, so the shared path's rounding is set beside the ordinary one.
``--vllm``: generation of the bfcl@4 prompts (each row repeated 4 times, as the trainer sends them;
40 new tokens each, eos ignored) by vLLM with its prefix caching on and off (``vllm.LLM`` built as
``VLLMRolloutEngine`` builds it, plus its statistics), wall seconds and the prefix cache's hit rate
(hit tokens over queried tokens, vLLM's own counters), each in a fresh process.
``--device cuda``: both engines on the GPU (bf16 autocast; each shape's attention as above, run by CUDA's kernels),
the update and log-prob pass timed in wall seconds after a synchronize, and the update's peak GPU memory above what
was allocated before it (``torch.cuda.max_memory_allocated``, in this process); no bf16-spread line. Where the real
model's GGUF is not installed, give ``--model`` a directory made beforehand with SmolLM2-135M's shapes and random
weights (``posttrain.models.tiny.make_tiny_model``, 30 layers of 576: docs/measured/shared_prefix_cuda.txt).
Last line: ``shared_prefix_update_speedup: X`` (bfcl@4, update, packed / shared CPU seconds; wall seconds on CUDA).
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from bench.train import fresh_memory, interleaved_medians, ppo_loss
from posttrain import keys
from posttrain.engines.training import TrainingEngine, TrainingEngineConfig
from posttrain.engines.training.inputs import build_model_inputs, lengths_to_mask
from posttrain.engines.training.packing import packed_layout, shared_prompt_layout
from posttrain.models import resolve_model
from posttrain.protocol import Batch, pad_rows


BFCL_PROMPT_CAP = 768  # bfcl_grpo's builtin_options.max_prompt_tokens


@dataclass(frozen=True)
class Shape:
    name: str
    micro: dict  # the preset's micro-batching: micro_batch_size or max_tokens
    log_prob_micro_batch_size: int
    attn_implementation: str


def bfcl_prompts(model_dir: Path, count: int, data_dir: Path | None, seed: int = 0) -> list[list[int]]:
    """Token ids of ``count`` BFCL training prompts with their functions, as bfcl_grpo renders them:
    a seeded draw from the rows within the preset's cap of 768 prompt tokens."""
    import tempfile

    from posttrain.data.format import read_rows
    from posttrain.data.preparers import prepare
    from posttrain.models import load_tokenizer
    from posttrain.models.loading import tokenize_prompts

    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="bench-bfcl-"))
        prepare("bfcl", data_dir, max_prompt_tokens=BFCL_PROMPT_CAP, no_call_share=0.2)
    rows = read_rows([data_dir / "train.parquet"])
    tokenizer = load_tokenizer(str(model_dir))
    prompts = [p for p in tokenize_prompts([list(r.messages) for r in rows], tokenizer, row_tools=[r.tools for r in rows])
               if len(p) <= BFCL_PROMPT_CAP]
    picked = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))[:count]
    return [prompts[i] for i in picked.tolist()]


def grouped_batch(prompts: list[list[int]], samples: int, response_lengths: list[int], vocab: int, seed: int = 1) -> Batch:
    """Each prompt ``samples`` times (a group side by side), random response ids of the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    repeated = [p for p in prompts for _ in range(samples)]
    width_p, width_r = max(map(len, repeated)), max(response_lengths)
    prompt_ids = pad_rows(repeated, width_p, 0, left=True)
    prompt_mask = pad_rows([[1] * len(p) for p in repeated], width_p, left=True)
    response_mask = lengths_to_mask(torch.tensor(response_lengths), width_r, left_padded=False)
    response_ids = torch.randint(1, vocab, (len(repeated), width_r), generator=generator) * response_mask
    tensors = build_model_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    tensors[keys.RESPONSE_MASK] = response_mask.float()
    tensors[keys.ADVANTAGES] = torch.randn(len(repeated), width_r, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(len(repeated), width_r, generator=generator) - 8.0
    return Batch.from_dict(tensors)


def engine(model_dir: Path, shape: Shape, share: bool, device: str = "cpu") -> TrainingEngine:
    config = TrainingEngineConfig(model_path=str(model_dir), lr=1e-6, device=device, share_prompt=share,
                                  attn_implementation=shape.attn_implementation)
    built = TrainingEngine(config)
    fresh_memory(built.module)
    return built


def tokens_computed(built: TrainingEngine, batch: Batch, shape: Shape) -> int:
    """Tokens the model computes over one update's micro-batches."""
    layout = shared_prompt_layout if built.share_prompt else packed_layout
    groups = built._micro_batch_groups(batch, shape.micro.get("micro_batch_size"), shape.micro.get("max_tokens"))
    return sum(layout(batch.index(group)).real_tokens for group in groups if group)


def update(built: TrainingEngine, batch: Batch, shape: Shape) -> None:
    built.train_mini_batch(batch, ppo_loss, with_entropy=True, **shape.micro)


def logprobs(built: TrainingEngine, batch: Batch, shape: Shape) -> torch.Tensor:
    return built.compute_logprobs(batch, micro_batch_size=shape.log_prob_micro_batch_size, with_entropy=True)[0]


def _peak_above_base(model_dir: Path, shape: Shape, share: bool, batch: Batch, queue) -> None:
    built = engine(model_dir, shape, share)
    update(built, batch, shape)  # warm: the allocator's first-touch pages are the same on both sides
    process, peak, done = psutil.Process(), [0], threading.Event()
    base = process.memory_info().rss

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    update(built, batch, shape)
    done.set()
    sampler.join()
    queue.put(max(peak[0], process.memory_info().rss) - base)


def peak_memory(model_dir: Path, shape: Shape, share: bool, batch: Batch) -> float:
    """GiB above the loaded model's resident memory at the peak of one update, in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_peak_above_base, args=(model_dir, shape, share, batch, queue))
    child.start()
    result = queue.get()
    child.join()
    return result / 2**30


def gpu_peak_above_base(built: TrainingEngine, batch: Batch, shape: Shape) -> float:
    """GiB of GPU memory one update allocates at its peak above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    update(built, batch, shape)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def timed(fns: list, repeats: int, device: str) -> list[float]:
    """Median seconds of each function in turns: CPU seconds on the CPU, wall seconds after a synchronize on CUDA."""
    if device == "cpu":
        return [cpu for _, cpu in interleaved_medians(fns, repeats)]

    def synchronized(fn):
        return lambda: (fn(), torch.cuda.synchronize())

    return [wall for wall, _ in interleaved_medians([synchronized(fn) for fn in fns], repeats)]


def measure(model_dir: Path, shape: Shape, batch: Batch, repeats: int, memory: bool, device: str = "cpu") -> float:
    off, on = engine(model_dir, shape, False, device), engine(model_dir, shape, True, device)
    tokens = tokens_computed(off, batch, shape), tokens_computed(on, batch, shape)
    update_off, update_on = timed([lambda: update(off, batch, shape), lambda: update(on, batch, shape)], repeats, device)
    lp_off, lp_on = timed([lambda: logprobs(off, batch, shape), lambda: logprobs(on, batch, shape)], repeats, device)
    clock = "CPU s" if device == "cpu" else "GPU wall s"
    print(f"{shape.name}: {len(batch)} samples, {shape.attn_implementation}, {shape.micro}, {device}")
    print(f"  {'tokens computed':<24} packed {tokens[0]:>7,}  shared {tokens[1]:>7,}  ratio {tokens[0] / tokens[1]:.2f}x")
    print(f"  {'update ' + clock:<24} packed {update_off:7.3f}  shared {update_on:7.3f}  speedup {update_off / update_on:.2f}x")
    print(f"  {'logprob pass ' + clock:<24} packed {lp_off:7.3f}  shared {lp_on:7.3f}  speedup {lp_off / lp_on:.2f}x")
    if memory:
        if device == "cpu":
            peaks = peak_memory(model_dir, shape, False, batch), peak_memory(model_dir, shape, True, batch)
        else:
            peaks = gpu_peak_above_base(off, batch, shape), gpu_peak_above_base(on, batch, shape)
        print(f"  {'update peak GiB':<24} packed {peaks[0]:7.2f}  shared {peaks[1]:7.2f}  ratio {peaks[0] / max(peaks[1], 1e-9):.2f}x")
    return update_off / update_on


def _vllm_generation(model_dir: Path, prompts: list[list[int]], caching: bool, queue) -> None:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype="bfloat16", max_model_len=1024, seed=0, enforce_eager=True,
              kv_cache_memory_bytes=2**30, enable_prefix_caching=caching, enable_chunked_prefill=False,
              disable_log_stats=False)
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=0)
    rows = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(rows[:1], params, use_tqdm=False)  # warm-up (its prompt is in the cache afterwards: reset)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    llm.generate(rows, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    counters = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    queries, hits = counters.get("vllm:prefix_cache_queries", 0), counters.get("vllm:prefix_cache_hits", 0)
    queue.put((seconds, hits / queries if queries else float("nan")))


def vllm_prefix_caching(model_dir: Path, prompts: list[list[int]], samples: int) -> None:
    rows = [p for p in prompts for _ in range(samples)]
    context = multiprocessing.get_context("spawn")
    results = {}
    for caching in (True, False):
        queue = context.Queue()
        child = context.Process(target=_vllm_generation, args=(model_dir, rows, caching, queue))
        child.start()
        results[caching] = queue.get()
        child.join()
    (on_s, on_hit), (off_s, off_hit) = results[True], results[False]
    print(f"vLLM prefix caching, {len(rows)} rows ({samples} per prompt), 40 new tokens: on {on_s:.1f} s "
          f"(hit rate {on_hit:.3f}), off {off_s:.1f} s (hit rate {off_hit:.3f}): generation {off_s / on_s:.2f}x faster with it")


def bf16_spread(model_dir: Path, batch: Batch) -> None:
    """Packed vs packed with other micro-batch contents, and shared vs packed, under the engine's dtype."""
    shape = Shape("spread", {}, 4, "sdpa")
    off, on = engine(model_dir, shape, False), engine(model_dir, shape, True)
    mask = batch[keys.RESPONSE_MASK].bool()
    packed_4 = off.compute_logprobs(batch, micro_batch_size=4)[0]
    packed_16 = off.compute_logprobs(batch, micro_batch_size=16)[0]
    shared_4 = on.compute_logprobs(batch, micro_batch_size=4)[0]
    itself = (packed_4 - packed_16)[mask].abs()
    across = (shared_4 - packed_4)[mask].abs()
    print(f"bf16 spread ({off.compute_dtype}): packed vs packed (micro 4 vs 16) max {itself.max():.4f} mean {itself.mean():.5f}; "
          f"shared vs packed max {across.max():.4f} mean {across.mean():.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is stable on a shared 2-core machine)")
    parser.add_argument("--bfcl-data", type=Path, help="a `posttrain prepare bfcl` directory (default: prepared here)")
    parser.add_argument("--response-lengths", type=Path, help="recorded BFCL response lengths, one per line")
    parser.add_argument("--prompts", type=int, default=8, help="BFCL prompts per batch (the preset trains on 16)")
    parser.add_argument("--memory-shapes", default="bfcl@4", help="shapes whose peak memory is measured (fresh processes)")
    parser.add_argument("--shapes", default="bfcl@4,bfcl@8,main")
    parser.add_argument("--vllm", action="store_true", help="also vLLM's prefix caching on vs off (bfcl@4 prompts)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both engines run (cuda: wall seconds)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; times are GPU wall seconds")
    vocab = 49152
    generator = torch.Generator().manual_seed(0)
    recorded = [int(x) for x in args.response_lengths.read_text().split()] if args.response_lengths else None
    prompts = bfcl_prompts(model_dir, args.prompts, args.bfcl_data)
    print(f"bfcl prompts: {len(prompts)}, tokens mean {sum(map(len, prompts)) / len(prompts):.0f}, max {max(map(len, prompts))}")
    if args.vllm:
        vllm_prefix_caching(model_dir, prompts, 4)
    headline = None
    for name in filter(None, args.shapes.split(",")):
        start = time.perf_counter()
        if name.startswith("bfcl@"):
            samples, _, micro = name.split("@")[1].partition("/")
            samples = int(samples)
            # /8: micro-batches of 8 samples; /t4096: by a budget of 4,096 tokens (use_dynamic_bsz), the same on both sides
            micro = {"max_tokens": int(micro[1:])} if micro.startswith("t") else {"micro_batch_size": int(micro or 4)}
            count = len(prompts) * samples
            lengths = ([recorded[i % len(recorded)] for i in range(count)] if recorded
                       else torch.randint(20, 61, (count,), generator=generator).tolist())
            batch = grouped_batch(prompts, samples, lengths, vocab)
            shape = Shape(name, micro, 16, "sdpa")
        else:
            main_prompts = [torch.randint(1, vocab, (int(n),), generator=generator).tolist()
                            for n in torch.randint(40, 61, (8,), generator=generator)]
            batch = grouped_batch(main_prompts, 8, torch.randint(8, 49, (64,), generator=generator).tolist(), vocab)
            shape = Shape(name, {"max_tokens": 2048}, 32, "eager")
        speedup = measure(model_dir, shape, batch, args.repeats, name in args.memory_shapes.split(","), args.device)
        print(f"  ({time.perf_counter() - start:.0f} s)")
        if name == "bfcl@4":
            headline = speedup
            if args.device == "cpu":
                bf16_spread(model_dir, batch)
    if headline is not None:
        print(f"shared_prefix_update_speedup: {headline:.2f}")


if __name__ == "__main__":
    main()
