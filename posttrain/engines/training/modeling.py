"""Building the trained model and running it on one micro-batch.

Models. A policy is the causal LM itself (``posttrain.models.load_causal_lm``). A critic is
``AutoModelForTokenClassification`` with ``num_labels=1`` on the same checkpoint: transformers
loads the decoder backbone from the causal LM's weights and adds a freshly initialised
``score = Linear(hidden, 1)`` per token. It is chosen over a hand-made backbone + Linear because
it is a plain Hugging Face class, so an exported critic reloads with ``from_pretrained`` and no
custom code; its classifier dropout is set to 0 so that training and evaluation see the same
values. Master weights are float32.

LoRA (``lora_rank > 0``) wraps the model in ``peft`` adapters (no dropout, no bias); a critic also
trains its ``score`` head in full (``modules_to_save``). ``"all-linear"`` means every Linear of
the decoder, never the LM head or the value head.

Forward pass on a micro-batch. Columns that are padding in every row (left of the longest prompt,
right of the longest response) are cut off first, so a micro-batch of short sequences costs what
its longest sequence costs, not what the longest of the whole batch does. The logprob of response
token t is read from the logits at input position P + t - 1 (the position that predicts it): the
LM head runs on those T positions only (``logits_to_keep`` as an index tensor), and the log-softmax
is taken chunk by chunk (``posttrain.algos.logprobs_from_logits``). Values use the same alignment:
the value of response token t is the critic's output at position P + t - 1, the state before the
token was generated. Outputs at response padding (attention mask 0) are exactly 0.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posttrain import keys
from posttrain.algos import entropy_from_logits, logprobs_from_logits
from posttrain.engines.training.config import TrainingEngineConfig
from posttrain.engines.training.inputs import response_attention_mask
from posttrain.models import check_causal_lm_config, load_causal_lm
from posttrain.protocol import Batch


@dataclass(frozen=True)
class ForwardOutputs:
    """What the engine computed for a micro-batch of b samples (each (b, T) float32, or None)."""

    logprobs: Tensor | None = None  # log pi(response token), tempered logits
    entropy: Tensor | None = None  # entropy of the tempered next-token distribution
    values: Tensor | None = None  # critic value per response token


def resolve_attn_implementation(setting: str, device: torch.device) -> str:
    """``auto``: sdpa on CUDA, eager on CPU (``TrainingEngineConfig.attn_implementation`` says why)."""
    if setting != "auto":
        return setting
    return "sdpa" if device.type == "cuda" else "eager"


def build_model(model_dir: Path, config: TrainingEngineConfig, attn_implementation: str = "sdpa") -> nn.Module:
    """The float32 model on CPU, with its attention kernels, gradient checkpointing and LoRA as configured."""
    check_causal_lm_config(model_dir)
    # Seeded so every rank draws the same adapters and value head (FSDP does not broadcast them),
    # without disturbing the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = _load_value_model(model_dir) if config.value_head else load_causal_lm(model_dir, dtype=torch.float32)
        model.set_attn_implementation(attn_implementation)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.lora_rank > 0:
            model = _add_lora(model, config)
    return model


def _load_value_model(model_dir: Path) -> nn.Module:
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        raise ValueError(
            f"{model_dir} is a {model_type!r} model, for which transformers has no token-classification "
            "class, so it cannot carry a value head; use a llama, qwen2, mistral or similar model for the critic"
        )
    config = AutoConfig.from_pretrained(model_dir, num_labels=1)
    config.classifier_dropout = 0.0
    return AutoModelForTokenClassification.from_pretrained(model_dir, config=config, dtype=torch.float32)


def _add_lora(model: nn.Module, config: TrainingEngineConfig) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ImportError("lora_rank > 0 needs the peft package: `python -m pip install peft`") from error
    targets = config.lora_target_modules
    if config.value_head and targets == "all-linear":
        # peft's "all-linear" would adapt the value head too; name the decoder's Linears instead.
        linears = [name for name, m in model.base_model.named_modules() if isinstance(m, nn.Linear)]
        targets = sorted({name.rsplit(".", 1)[-1] for name in linears})
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=list(targets) if not isinstance(targets, str) else targets,
        lora_dropout=0.0,
        bias="none",
        modules_to_save=["score"] if config.value_head else None,
    )
    return get_peft_model(model, lora)


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device``; a no-op for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _trim_bounds(attention_mask: Tensor, prompt_length: int) -> tuple[int, int]:
    # [start, end): the columns some row attends, always keeping the last prompt column (it
    # predicts the first response token) and at least one response column.
    real = attention_mask.any(dim=0).nonzero().flatten().tolist()
    start = min(real[0], prompt_length - 1) if real else prompt_length - 1
    end = max(real[-1] + 1, prompt_length + 1) if real else prompt_length + 1
    return start, end


def forward_micro_batch(
    model: nn.Module,
    micro_batch: Batch,
    *,
    device: torch.device,
    dtype: torch.dtype,
    value_head: bool,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> ForwardOutputs:
    """Run ``model`` on a micro-batch (see the module docstring); differentiable if grad is on."""
    input_ids = micro_batch[keys.INPUT_IDS]
    response_length = micro_batch[keys.RESPONSE_IDS].shape[1]
    prompt_length = input_ids.shape[1] - response_length
    start, end = _trim_bounds(micro_batch[keys.ATTENTION_MASK], prompt_length)
    columns = slice(start, end)
    inputs = {
        "input_ids": input_ids[:, columns].to(device),
        "attention_mask": micro_batch[keys.ATTENTION_MASK][:, columns].to(device),
        "position_ids": micro_batch[keys.POSITION_IDS][:, columns].to(device),
        "use_cache": False,
    }
    # Input positions (within the trimmed window) whose outputs score response tokens 0..end-P-1.
    scored = torch.arange(prompt_length - 1 - start, end - 1 - start, device=device)
    kept = end - prompt_length
    keep_mask = response_attention_mask(micro_batch)[:, :kept].to(device) != 0

    def finish(per_token: Tensor) -> Tensor:  # (b, kept) -> (b, T), exact zeros at padding
        per_token = torch.where(keep_mask, per_token.float(), torch.zeros((), device=device))
        return F.pad(per_token, (0, response_length - kept))

    if value_head:
        with autocast(device, dtype):
            values = model(**inputs).logits[:, scored, 0]
        return ForwardOutputs(values=finish(values))
    with autocast(device, dtype):
        logits = model(**inputs, logits_to_keep=scored).logits
    if temperature != 1.0:
        logits = logits / temperature
    labels = micro_batch[keys.RESPONSE_IDS][:, :kept].to(device)
    logprobs = finish(logprobs_from_logits(logits, labels))
    entropy = finish(entropy_from_logits(logits)) if with_entropy else None
    return ForwardOutputs(logprobs=logprobs, entropy=entropy)
