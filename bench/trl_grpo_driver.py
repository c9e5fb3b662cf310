"""TRL's GRPOTrainer on the task that ``bench/vs_trl.py`` writes, run in a Python that has TRL.

Not a posttrain module: ``bench/vs_trl.py`` starts it as a script in the TRL Python, with the
posttrain checkout on ``PYTHONPATH`` so that the reward is posttrain's own arithmetic score (the
same function on the same decoded text, not a copy). It imports TRL, transformers, datasets and
torch, and from posttrain only :mod:`posttrain.rewards.arithmetic` (no torch, no Ray).

TRL's settings are posttrain's, where TRL's defaults differ: the training dtype ``--dtype``
(``bf16=True`` for bfloat16, TRL's default: autocast over float32 weights, as posttrain does;
``bf16=False`` for float32), no gradient checkpointing (TRL's default is on, posttrain's off), constant
learning rate, AdamW weight decay 0.01, ``shuffle_dataset=False`` (posttrain runs with
``data.shuffle=false``, so both see the same prompts in the same order). One optimizer step per
step: one generation batch of prompts x n completions, in micro-batches of ``--micro-batch``
completions with gradient accumulation over the rest. Generation is HF ``generate`` (TRL's default,
``use_vllm=False``), or with ``--vllm`` TRL's vLLM in colocate mode (``use_vllm=True,
vllm_mode="colocate"``: the engine in this process). ``--attn`` is the attention of the trained
model; HF ``generate`` runs with sdpa (as posttrain's HF engine does), the model switched to it for
generation and back.

Phases, per step: ``generation`` (TRL's ``_generate_single_turn``: the engine's time) and
``generate_and_score`` (``_generate_and_score_completions``: generation, rewards, advantages and any
logprob pass); the rest of a step is the update.

Appends the wall time (unix seconds) of the end of every optimizer step to ``--steps-file`` as the
step ends (``bench/vs_trl.py`` watches it to read the process's CPU time then), and at the end
writes ``--out``: ``{"logs": [TRL's log dicts], "phases": [{phase: seconds} per step], "trl": version,
"generation": "hf generate" or "vllm colocate", "torch_threads": n}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator

import torch
import trl
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from posttrain.rewards.arithmetic import compute_score


def arithmetic_reward(completions, reward_model, **_) -> list[float]:
    """posttrain's score of each completion against the row's ``reward_model.ground_truth``."""
    return [compute_score(completion[-1]["content"], truth["ground_truth"])["score"]
            for completion, truth in zip(completions, reward_model)]


class StepClock(TrainerCallback):
    """The wall time at the end of every optimizer step, a line each in ``steps_file``; every log TRL
    writes; the seconds each step spent in the methods :meth:`time` wraps."""

    def __init__(self, steps_file: str) -> None:
        self.steps_file = steps_file
        self.logs: list[dict] = []
        self.phases: list[dict[str, float]] = []
        self.current: dict[str, float] = {}

    def time(self, owner, method: str, phase: str, around=None) -> None:
        """Count ``owner.method``'s wall time into ``phase``; ``around``: a context manager factory to run it in."""
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                if around is None:
                    return original(*args, **kwargs)
                with around():
                    return original(*args, **kwargs)
            finally:
                self.current[phase] = self.current.get(phase, 0.0) + time.perf_counter() - start

        setattr(owner, method, timed)

    def on_step_end(self, args, state, control, **kwargs):
        with open(self.steps_file, "a") as out:
            out.write(f"{time.time()}\n")
        self.phases.append(self.current)
        self.current = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local model directory (HF format)")
    parser.add_argument("--train", required=True, help="the train.parquet that bench/vs_trl.py wrote")
    parser.add_argument("--out", required=True, help="where to write the JSON of TRL's logs")
    parser.add_argument("--steps-file", required=True, help="where to append each step's end time")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--prompts", type=int, required=True, help="prompts per step")
    parser.add_argument("--n", type=int, required=True, help="completions per prompt")
    parser.add_argument("--micro-batch", type=int, required=True, help="completions per forward/backward")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--weight-decay", type=float, required=True)
    parser.add_argument("--grad-clip", type=float, required=True)
    parser.add_argument("--clip-ratio", type=float, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="training compute dtype")
    parser.add_argument("--attn", default="eager", help="the trained model's attention implementation")
    parser.add_argument("--vllm", action="store_true", help="generate with TRL's vLLM, colocate mode")
    args = parser.parse_args()

    completions = args.prompts * args.n
    if completions % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide prompts x n = {completions}")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"), report_to="none", save_strategy="no", logging_steps=1,
        use_cpu=True, bf16=args.dtype == "bfloat16", gradient_checkpointing=False, seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=args.n, max_completion_length=args.max_new_tokens, temperature=args.temperature,
        beta=0.0, num_iterations=1, epsilon=args.clip_ratio, loss_type="dapo", scale_rewards="group",
        learning_rate=args.lr, lr_scheduler_type="constant", weight_decay=args.weight_decay,
        max_grad_norm=args.grad_clip, shuffle_dataset=False, use_vllm=args.vllm,
        **({"vllm_mode": "colocate"} if args.vllm else {}),
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=args.attn)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    clock = StepClock(args.steps_file)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=arithmetic_reward, args=config,
                          train_dataset=load_dataset("parquet", data_files=args.train, split="train"), callbacks=[clock])
    clock.time(trainer, "_generate_single_turn", "generation", around=None if args.vllm else lambda: attention(model, "sdpa"))
    clock.time(trainer, "_generate_and_score_completions", "generate_and_score")
    trainer.train()
    with open(args.out, "w") as out:
        json.dump({"logs": clock.logs, "phases": clock.phases, "trl": trl.__version__,
                   "generation": "vllm colocate" if args.vllm else "hf generate", "torch_threads": torch.get_num_threads()}, out)


@contextlib.contextmanager
def attention(model, implementation: str) -> Iterator[None]:
    """``model`` with another attention implementation for the duration."""
    before = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


if __name__ == "__main__":
    main()
