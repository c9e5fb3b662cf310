"""The training engine's settings: one flat, explicit dataclass.

Workers build it from their config section (``actor_rollout_ref.actor``, ``critic``); the engine
never reads the config tree itself. Every problem is collected and reported at once, naming the
field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.errors import InvalidSettings, Problem

STRATEGIES = ("auto", "none", "ddp", "fsdp")
LR_SCHEDULERS = ("constant", "cosine")
DTYPES = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa")


@dataclass(frozen=True)
class TrainingEngineConfig:
    """How to build and train one model.

    model_path:    local Hugging Face directory (or a built-in name of ``posttrain.models``).
    value_head:    False: the causal LM (a policy or reference). True: the same backbone with a
                   scalar value head (``AutoModelForTokenClassification``, ``num_labels=1``), a critic.
    dtype:         the autocast compute dtype, ``bfloat16`` or ``float32`` (autocast off), or ``auto``:
                   bfloat16 where the hardware computes it natively (CUDA; a CPU with AVX-512 BF16
                   or AMX), float32 elsewhere — on an AVX2-only CPU bfloat16 autocast is emulated and
                   measured 18x slower for a training step. Master weights, gradients and optimizer
                   state are always float32. float16 is refused: it needs loss scaling, which the
                   engine does not do.
    lr, betas, eps, weight_decay: AdamW's (decay applies to every trainable parameter, as verl).
    lr_scheduler:  ``constant`` or ``cosine``, both after ``warmup_steps`` of linear warmup; cosine
                   decays to ``min_lr_ratio * lr`` over ``total_steps`` (needed for cosine).
    grad_clip:     max global gradient norm (> 0); None computes the norm but does not clip.
    gradient_checkpointing: recompute activations in the backward pass (less memory, ~30% slower).
    attn_implementation: the model's attention kernels: ``sdpa`` (PyTorch's fused attention), ``eager``
                   (transformers' matmul + softmax), or ``auto``: sdpa on CUDA, eager on CPU, where
                   sdpa's CPU backward pass is slow: eager made a whole update of SmolLM2-135M on
                   sequences of ~100 tokens 1.3x faster (``bench/update.py``). Its (b, heads, T, T)
                   scores grow with the square of the length: try sdpa for sequences of thousands.
    pack_sequences: run the model on each sample's real tokens only, several samples to a row, each
                   attending only to itself (``packing``; verl's ``use_remove_padding``), instead of
                   on padded rows. The results agree to rounding; off only to compare the two.
    share_prompt:  with ``pack_sequences``, the samples of a micro-batch that share a prompt run it
                   once, their responses after it, each seeing the prompt and itself only
                   (``packing.shared_prompt_layout``); exact, and cheaper by the prompt's repeats
                   (docs/performance.md). Models whose attention cannot take its mask are refused
                   (``modeling.shared_prompt_problem``); off only to compare.
    compile:       ``torch.compile`` each decoder layer (inductor; regional compilation: one layer's
                   graphs serve every layer). On CPU the main job's update (SmolLM2-135M, 64
                   sequences) ran 1.09-1.29x faster once compiled; the first update compiles for
                   40-100 s (the whole model took ~320 s for the same speed), and a second
                   micro-batch shape compiles once more with dynamic shapes. It pays back after
                   8-30 updates (``bench/update_peak.py --compile``); off by default.
    lora_rank:     0 trains every weight; > 0 trains LoRA adapters (``peft``) of this rank on
                   ``lora_target_modules`` with scale ``lora_alpha / lora_rank``.
    strategy:      ``auto`` (world size 1: none; CPU: ddp; CUDA: fsdp), ``none``, ``ddp``, ``fsdp``.
    cpu_offload:   FSDP2 only: sharded parameters, gradients and optimizer state live on the CPU and
                   the optimizer step runs there (``CPUOffloadPolicy``).
    device:        ``auto`` (CUDA if available, else CPU), ``cpu`` or ``cuda``.
    metric_prefix: namespace of the metrics the engine reports (``actor/grad_norm``).
    init_seed:     seeds the random parts of model construction (LoRA adapters, value head), so
                   every rank builds the same initial weights.
    """

    model_path: str
    value_head: bool = False
    dtype: str = "auto"
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    gradient_checkpointing: bool = False
    attn_implementation: str = "auto"
    pack_sequences: bool = True
    share_prompt: bool = True
    compile: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    strategy: str = "auto"
    cpu_offload: bool = False
    device: str = "auto"
    metric_prefix: str = "actor"
    init_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if not isinstance(self.lora_target_modules, str):
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        problems = self.problems()
        if problems:
            raise InvalidSettings("TrainingEngineConfig", problems)

    def problems(self) -> list[Problem]:
        """Every inconsistency, each naming the field, its value and what to do."""
        found = _choice_problems(self) + _range_problems(self)
        if self.lr_scheduler == "cosine" and self.total_steps is None:
            found.append(Problem("lr_scheduler", "cosine", "needs total_steps (the number of optimizer steps to decay over)"))
        if self.total_steps is not None and self.total_steps < max(1, self.warmup_steps):
            found.append(Problem("total_steps", self.total_steps, f"must be >= 1 and >= warmup_steps={self.warmup_steps}"))
        if self.cpu_offload and self.strategy in ("none", "ddp"):
            found.append(Problem("cpu_offload", True, f"needs strategy 'fsdp' or 'auto' on CUDA, not {self.strategy!r}"))
        return found


def _choice_problems(config: TrainingEngineConfig) -> list[Problem]:
    choices = {
        "strategy": STRATEGIES, "lr_scheduler": LR_SCHEDULERS, "dtype": DTYPES, "device": DEVICES,
        "attn_implementation": ATTN_IMPLEMENTATIONS,
    }
    return [
        Problem(name, getattr(config, name), f"use one of {', '.join(allowed)}")
        for name, allowed in choices.items()
        if getattr(config, name) not in allowed
    ]


def _range_problems(config: TrainingEngineConfig) -> list[Problem]:
    found = []
    if not config.lr > 0:
        found.append(Problem("lr", config.lr, "must be > 0 (e.g. 1e-6 for RL, 1e-5 for SFT)"))
    if len(config.betas) != 2 or not all(0 <= b < 1 for b in config.betas):
        found.append(Problem("betas", list(config.betas), "need two numbers in [0, 1), e.g. [0.9, 0.999]"))
    if config.weight_decay < 0:
        found.append(Problem("weight_decay", config.weight_decay, "must be >= 0"))
    if config.eps <= 0:
        found.append(Problem("eps", config.eps, "must be > 0"))
    if config.warmup_steps < 0:
        found.append(Problem("warmup_steps", config.warmup_steps, "must be >= 0"))
    if not 0 <= config.min_lr_ratio <= 1:
        found.append(Problem("min_lr_ratio", config.min_lr_ratio, "must be in [0, 1]"))
    if config.grad_clip is not None and not config.grad_clip > 0:
        found.append(Problem("grad_clip", config.grad_clip, "must be > 0 (the largest gradient norm kept; a large value rarely clips), or None for no clipping"))
    if config.lora_rank < 0:
        found.append(Problem("lora_rank", config.lora_rank, "must be >= 0 (0: train every weight)"))
    if config.lora_rank > 0 and config.lora_alpha <= 0:
        found.append(Problem("lora_alpha", config.lora_alpha, "must be > 0 with LoRA (lora_rank > 0)"))
    return found
