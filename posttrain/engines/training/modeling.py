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

Forward pass on a micro-batch. The samples go in packed (each sample's real tokens only, several
to a row) or padded (cut to the attended columns); ``posttrain.engines.training.packing`` lays
them out and says which output scores which response token: the one at the position before it.
The policy's logits are made only there: the model runs with its own head on no position
(``logits_to_keep`` empty), and its final hidden states at the scored positions go through the
head's weight chunk by chunk, fused with the log-softmax and the entropy and recomputed in the
backward pass (``posttrain.algos.head_logprobs``), so no (tokens x vocabulary) logits or logit
gradient exist beyond a chunk. A head that is not a plain bias-free Linear, or whose logits the
model scales or caps, takes the model's own logits instead (``plain_head``). Under FSDP2 the
head's weight lives in the root module, whose parameters stay gathered from its forward pass until
its backward (FSDP2 does not reshard the root after forward): the fused head reads the gathered
weight after the forward, its gradient accumulates there, and the root's post-backward
reduce-scatters it with the rest. Values use the same alignment: the value of response token t is the
critic's output at the position before it, the state before the token was generated. Outputs at
response padding (attention mask 0) are exactly 0.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from posttrain import keys
from posttrain.algos import entropy_from_logits, head_logprobs, logprobs_from_logits
from posttrain.engines.training.config import TrainingEngineConfig
from posttrain.engines.training.packing import Layout, packed_layout, padded_layout, shared_prompt_layout
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


def forward_micro_batch(
    model: nn.Module,
    micro_batch: Batch,
    *,
    device: torch.device,
    dtype: torch.dtype,
    value_head: bool,
    temperature: float = 1.0,
    with_entropy: bool = False,
    pack: bool = True,
    share_prompt: bool = False,
) -> ForwardOutputs:
    """Run ``model`` on a micro-batch (see the module docstring); differentiable if grad is on.

    ``share_prompt`` (with ``pack``): samples with the same prompt run it once (``shared_prompt_layout``)."""
    layout = _layout(model, micro_batch, pack, share_prompt)
    inputs = {name: tensor.to(device) for name, tensor in layout.inputs.items()}
    scored = layout.scored.to(device)
    shape = micro_batch[keys.RESPONSE_IDS].shape
    where = (layout.samples.to(device), layout.columns.to(device))

    def place(per_token: Tensor) -> Tensor:  # (N,) -> (b, T), exact zeros at every other position
        return torch.zeros(shape, dtype=torch.float32, device=device).index_put(where, per_token.float())

    if value_head:
        with autocast(device, dtype):
            values = model(**inputs, use_cache=False).logits[..., 0]
        return ForwardOutputs(values=place(values.reshape(-1)[scored]))
    labels = layout.labels.to(device)
    head = plain_head(model)
    if head is None:  # a head the fused path cannot take: the model's own logits, then the chunked softmax
        # The head runs on the columns that hold a scored position (the response columns when padded).
        columns = torch.unique(scored % layout.width)
        with autocast(device, dtype):
            logits = model(**inputs, use_cache=False, logits_to_keep=columns).logits
        kept = (scored // layout.width) * len(columns) + torch.searchsorted(columns, scored % layout.width)
        logits = logits.reshape(-1, logits.shape[-1])[kept] / temperature
        logprobs = logprobs_from_logits(logits, labels)
        entropy = entropy_from_logits(logits) if with_entropy else None
    else:
        with autocast(device, dtype):
            outputs = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=torch.zeros(0, dtype=torch.long, device=device))
        hidden = outputs.hidden_states[-1]
        hidden = hidden.reshape(-1, hidden.shape[-1])[scored]
        logprobs, entropy = head_logprobs(
            hidden, _unsharded_weight(head.weight), labels, temperature=temperature, with_entropy=with_entropy, compute_dtype=dtype
        )
    return ForwardOutputs(logprobs=place(logprobs), entropy=place(entropy) if with_entropy else None)


def _layout(model: nn.Module, micro_batch: Batch, pack: bool, share_prompt: bool) -> Layout:
    if not pack:
        return padded_layout(micro_batch)
    if share_prompt:
        eager = _attention_implementation(model) == "eager"
        return shared_prompt_layout(micro_batch, mask_dtype=torch.float32 if eager else torch.bool)
    return packed_layout(micro_batch, one_row="flash" in _attention_implementation(model))


def shared_prompt_problem(model_config: Any, attn_implementation: str | None) -> str | None:
    """Why a model cannot run the shared-prompt layout (its mask would not be exact), or None.

    ``model_config``: the model's transformers config. The layout hands the attention an explicit
    4D mask: eager and sdpa take it as it is; flash attention reads packing from position ids only,
    and a sliding-window or chunked layer would have its own window replaced by the layout's full
    causal one. ``attn_implementation`` None: not judged (a config's choices are all eager or sdpa).
    """
    if attn_implementation is not None and attn_implementation not in ("eager", "sdpa"):
        return f"its attention implementation is {attn_implementation!r}; the shared prompt needs eager or sdpa"
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    windowed = getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True)
    if layer_types != {"full_attention"} or windowed:
        kinds = ", ".join(sorted(layer_types - {"full_attention"})) or "sliding_window"
        return f"it has attention layers other than full causal ones ({kinds}), which the layout's mask would override"
    return None


def model_shared_prompt_problem(model: nn.Module) -> str | None:
    """:func:`shared_prompt_problem` for a built model (peft or DDP wrapped or not)."""
    return shared_prompt_problem(getattr(_base_model(model), "config", None), _attention_implementation(model))


# Config fields by which a model caps or scales its head's output; with any of them in effect the fused
# head would compute other logits than the model's, so it is not used.
_LOGIT_CAPS = ("final_logit_softcapping",)
_LOGIT_SCALES = ("logit_scale", "logits_scaling", "output_multiplier_scale")


def _base_model(model: nn.Module) -> nn.Module:
    while isinstance(getattr(model, "module", None), nn.Module):  # DDP
        model = model.module
    if hasattr(model, "get_base_model"):  # peft
        model = model.get_base_model()
    return model


def plain_head(model: nn.Module) -> nn.Linear | None:
    """The LM head when the logits are exactly hidden @ head.weight.T, else None.

    None for a head with a bias and for a model that scales or caps its logits. Under FSDP2 the
    weight is a sharded DTensor until the root's forward gathers it (module docstring).
    """
    base = _base_model(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return None
    if any(getattr(config, name, None) is not None for name in _LOGIT_CAPS):
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_SCALES):
        return None
    return head


def _unsharded_weight(weight: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(weight, DTensor):
        raise RuntimeError(
            "the LM head's weight is still sharded after the model's forward pass; the fused head needs "
            "FSDP2 to keep the root module gathered until backward (apply_fsdp2 leaves reshard_after_forward "
            "at its default for the root)"
        )
    return weight


def _attention_implementation(model: nn.Module) -> str:
    return getattr(getattr(_base_model(model), "config", None), "_attn_implementation", "") or ""
