"""The SFT step's time by how its transcripts are cut into micro-batches, on a recipe's own transcripts.

The SFT warm-up is most of the bfcl recipe's time, and it is compute-bound. A micro-batch's samples
are packed into rows as wide as its longest sample (``engines/training/packing.py``), and attention
runs over a whole row: the longer the micro-batch, the more attention work between samples that
never see each other. The loss is the token mean over the whole batch (one normaliser for all its
micro-batches), so cutting the same 16 transcripts otherwise changes the update only by the order in
which sums are taken.

It times ``TrainingEngine.train_mini_batch`` with ``sft_objective``, as ``PolicyWorker.sft_step``
runs it, on the first ``--steps`` batches the SFT stage itself draws (its preset, overrides, seed and
batch size), once per micro-batch size in ``--micro``, in turns (``bench.train.interleaved_medians``: each size once
first, then rounds in an order reversed every other round), median of ``--repeats`` rounds. The engine is the stage's, built as PolicyWorker builds it (its model, dtype,
attention implementation and packing);
the weights change with every update, which does not change the time. Wall and CPU seconds of this
process, on ``--threads`` torch threads (the worker's own: 2 on this machine).

Headline: sft_step_speedup = the first size's median wall seconds a step / the fastest size's.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
from pathlib import Path

import torch

from bench.train import interleaved_medians
from posttrain.config import load_config
from posttrain.config.loader import preset_path
from posttrain.data import PromptDataLoader
from posttrain.models import load_tokenizer, resolve_model
from posttrain.rollout import build_rollout
from posttrain.rollout.toolbox import tool_schemas
from posttrain.trainer.data_setup import resolve_files
from posttrain.trainer.sft import sft_datasets, transcripts_to_batch
from posttrain.workers.engines import training_engine
from posttrain.workers.objectives import sft_objective

# the bfcl recipe's sft stage (posttrain/recipes/bfcl.yaml)
BFCL_SFT = ["data.builtin_options.swapped_irrelevance=300", "data.builtin_options.parallel_pairs=300"]


def stage_batches(preset: str, overrides: list[str], steps: int):
    """(config, the stage's first ``steps`` batches) as ``posttrain sft --preset PRESET OVERRIDES`` draws them."""
    config = load_config([preset_path(preset)], overrides, checks=None)
    tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
    data_dir = Path(resolve_files(config.data)[0][0]).parent
    rollout = build_rollout(config, tokenizer, data_dir)
    train_set, _ = sft_datasets(config, tokenizer, data_dir, rollout.stop_strings, tool_schemas(config.env))
    loader = PromptDataLoader(train_set, config.sft.train_batch_size, tokenizer.pad_token_id, seed=config.sft.seed,
                              collate=transcripts_to_batch)
    return config, list(itertools.islice(iter(loader), steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bfcl_sft")
    parser.add_argument("--micro", default="4,2,1", help="micro-batch sizes (samples), the first the baseline")
    parser.add_argument("--steps", type=int, default=3, help="batches (optimizer steps) per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*", default=BFCL_SFT, help="key=value (default: the bfcl recipe's sft stage's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(size) for size in args.micro.split(",")]
    config, batches = stage_batches(args.preset, args.overrides, args.steps)
    sft, arr = config.sft, config.actor_rollout_ref
    # as PolicyWorker builds it for the stage (its attention implementation above all: bfcl_sft's is sdpa)
    engine = training_engine(arr.model.path, arr.model, sft.optim, dtype=arr.actor.dtype, grad_clip=sft.grad_clip,
                             total_steps=1000, seed=config.trainer.seed, device="cpu",
                             attn_implementation=arr.actor.attn_implementation, compile=arr.actor.compile)
    lengths = [int(length) for batch in batches for length in batch["attention_mask"].sum(dim=1)]
    print(f"{args.preset} {' '.join(args.overrides)}: {len(batches)} batches of {sft.train_batch_size} transcripts, "
          f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f}); dtype {arr.actor.dtype}; attention "
          f"{arr.actor.attn_implementation}; {args.threads} threads")

    def steps(size: int) -> None:
        for batch in batches:
            engine.train_mini_batch(batch, sft_objective, micro_batch_size=size, loss_agg_mode="token-mean")

    # one update of every size first, then rounds in turns (the order reversed every other round), medians
    timed = interleaved_medians([functools.partial(steps, size) for size in sizes], args.repeats)
    medians = {size: (wall / len(batches), cpu / len(batches)) for size, (wall, cpu) in zip(sizes, timed)}
    for size, (wall, cpu) in medians.items():
        print(f"micro-batch {size}: {wall:.1f} s a step (CPU {cpu:.1f} s); {medians[sizes[0]][0] / wall:.3f}x the first")
    fastest = min(sizes, key=lambda size: medians[size][0])
    print(f"fastest: micro-batch {fastest}")
    print(f"sft_step_speedup: {medians[sizes[0]][0] / medians[fastest][0]:.3f}")


if __name__ == "__main__":
    main()
