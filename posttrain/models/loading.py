"""Finding and loading causal language models and their tokenizers (Hugging Face format).

A model is named either by a local directory in Hugging Face format (``config.json`` plus
safetensors weights and tokenizer files) or by a built-in name (see :data:`BUILTIN_MODELS`).
Nothing is downloaded: every machine this project runs on is offline.

Padding policy (:func:`ensure_pad_token`): if a tokenizer has no pad token, its eos token is used;
if it has no eos either, a dedicated ``<|pad|>`` token is added, but only when the model's
embedding already has a spare row for it (no resizing). Padding is never trained on: batches mark
real tokens with attention and response masks built from sequence lengths, never by comparing ids
with ``pad_token_id``, so a pad token that equals eos does not hide the eos that ends a response.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import InputError, MissingFileError
from posttrain.models.smollm2 import SMOLLM2_NAME, smollm2_model_dir
from posttrain.models.tool_format import render_with_tools

DEFAULT_MODEL = SMOLLM2_NAME
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {SMOLLM2_NAME: smollm2_model_dir}
DEDICATED_PAD_TOKEN = "<|pad|>"

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_model(name_or_path: str | Path) -> Path:
    """Return the local HF directory for a built-in model name, a model directory path, or a Hugging
    Face Hub model id (``Qwen/Qwen2.5-0.5B-Instruct``).

    Built-in names (``smollm2-135m-instruct``) are materialised into the cache on first use. A Hub id
    that is not a local directory comes from ``huggingface_hub``'s cache (``HF_HOME`` /
    ``HF_HUB_CACHE``), downloaded into it once when online; offline (``HF_HUB_OFFLINE=1``, or no
    network) only the cache is looked at. Anything else raises ``FileNotFoundError`` naming what was
    looked at and what to pass instead.
    """
    key = str(name_or_path)
    if key in BUILTIN_MODELS:
        return BUILTIN_MODELS[key]()
    problem = model_path_problem(key)
    if problem:
        raise MissingFileError(problem)
    path = Path(key).expanduser()
    return path.resolve() if path.exists() else _from_hub(key)


def model_path_problem(name_or_path: str) -> str | None:
    """Why ``name_or_path`` cannot name a model, found without loading or downloading anything
    (a Hub id is taken on trust here: :func:`resolve_model` says so if it is not on the Hub or in the
    cache); None when it can."""
    if name_or_path in BUILTIN_MODELS:
        return None
    path = Path(name_or_path).expanduser()
    if not path.exists():
        if HUB_ID.match(name_or_path):
            return None
        return (
            f"Model '{name_or_path}' is neither a built-in model ({', '.join(BUILTIN_MODELS)}), nor an existing directory "
            f"(looked at {path.resolve()}), nor a Hugging Face Hub id (owner/name). Pass a local Hugging Face model "
            "directory (one written with model.save_pretrained(dir) and tokenizer.save_pretrained(dir)) or a Hub id."
        )
    if not (path / "config.json").is_file():
        return (
            f"Model directory {path.resolve()} has no config.json, so it is not a Hugging Face "
            "model directory. Point to the directory that holds config.json and the *.safetensors "
            f"files, or use the built-in '{DEFAULT_MODEL}'."
        )
    return None


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hub spells repositories
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]  # weights as safetensors, tokenizer, configs


def _from_hub(repo_id: str) -> Path:
    """``repo_id``'s snapshot in huggingface_hub's cache: downloaded once when online, the cached one offline."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except RepositoryNotFoundError as err:
        raise MissingFileError(f"Model '{repo_id}': no such model on the Hugging Face Hub (or it is private: set HF_TOKEN)") from err
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        offline = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise MissingFileError(
            f"Model '{repo_id}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {offline}, so it cannot be "
            f"downloaded. On a machine that is online, run once `huggingface-cli download {repo_id}` (or any run with "
            "this model), or pass a local model directory instead."
        ) from err
    if not (path / "config.json").is_file():
        raise MissingFileError(f"Model '{repo_id}' from the Hub has no config.json at {path}; is it a transformers model?")
    return path


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float32`` for ``"float32"``/``"fp32"``/``torch.float32``, and likewise bf16, fp16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise InputError(f"Unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}.")
    return _DTYPES[dtype]


def resolve_dtype(setting: str | torch.dtype, device: torch.device | str | None = None) -> torch.dtype:
    """``setting`` as a dtype; ``auto`` is bfloat16 where ``device`` (default: CUDA if present, else the
    CPU) computes it natively (a CUDA GPU with bf16 units, Ampere or later; a CPU with AVX-512 BF16 or
    AMX), else float32."""
    if setting != "auto":
        return parse_dtype(setting)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    else:
        native = cpu_computes_bf16()
    return torch.bfloat16 if native else torch.float32


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) under which it has no bf16 instructions
_ONEDNN_BELOW_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_computes_bf16() -> bool:
    """The CPU has AVX-512 BF16 or AMX, and neither ATen (``ATEN_CPU_CAPABILITY``) nor oneDNN
    (``ONEDNN_MAX_CPU_ISA``) is told to stay below them. With both capped at AVX2, an AVX-512 machine
    computes bf16 as an AVX2-only CPU does (emulated, ~80x slower than natively), so ``auto`` takes
    float32 there too: this is how docs/performance.md measures the AVX2 figures on such a machine."""
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return False
    onednn_cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    return onednn_cap not in _ONEDNN_BELOW_BF16 and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _read_config_json(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def ensure_pad_token(tokenizer, vocab_size: int | None = None):
    """Give ``tokenizer`` a pad token if it has none (see the module docstring); returns it."""
    if tokenizer.pad_token is not None:
        return tokenizer
    if tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    if vocab_size is not None and len(tokenizer) < vocab_size:
        tokenizer.add_special_tokens({"pad_token": DEDICATED_PAD_TOKEN})
        return tokenizer
    raise InputError(
        f"Tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token, and the model's "
        f"embedding (vocab_size={vocab_size}) has no spare row for a dedicated pad token. Set "
        "pad_token in the model directory's tokenizer_config.json."
    )


def load_tokenizer(name_or_path: str | Path):
    """Load the tokenizer of a model (built-in name or directory), with a pad token ensured."""
    from transformers import AutoTokenizer

    path = resolve_model(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = _read_config_json(path)
    except (ValueError, OSError) as err:  # a model type this transformers does not know, a broken config.json
        raise InputError(f"{path}: cannot load its tokenizer and config ({type(err).__name__}: {err}); point the model path "
                         "(e.g. actor_rollout_ref.model.path) at a Hugging Face model directory that this transformers "
                         "version reads") from err
    return ensure_pad_token(tokenizer, config.get("vocab_size"))


def check_causal_lm_config(path: Path) -> None:
    """Raise ``ValueError`` unless ``path/config.json`` describes a decoder-only causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = _read_config_json(path).get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise InputError(
            f"{path / 'config.json'} declares model_type={model_type!r}, which transformers "
            "cannot load as a causal language model (AutoModelForCausalLM). posttrain trains and "
            "samples decoder-only models with a language-model head (e.g. llama, qwen2, mistral); "
            "point to such a model."
        )


def load_causal_lm(
    name_or_path: str | Path,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """Load a causal LM (built-in name or directory) in ``dtype`` on ``device``, in eval mode.

    Raises ``FileNotFoundError`` for a missing directory and ``ValueError`` for a config that is
    not a causal LM. The caller switches to ``train()`` when it trains.
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    check_causal_lm_config(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=parse_dtype(dtype))
    return model.to(device).eval()


def tokenize_prompts(
    conversations: list[list[dict[str, str]]], tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None,
    row_tools: Sequence[Sequence[dict[str, Any]] | None] | None = None, tool_format: str = "auto",
) -> list[list[int]]:
    """Token ids of each conversation after the chat template with the generation prompt added;
    with ``tools`` (OpenAI-style schemas) the model is told about them, and with ``row_tools`` (one
    entry per conversation) about that conversation's own tools too, in ``tool_format``
    (``env.tool_format``, models/tool_formats/)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template, so chat "
            "prompts cannot be formatted; use an instruct/chat model's tokenizer or set chat_template "
            "in its tokenizer_config.json"
        )
    if not conversations:
        return []
    texts = render_with_tools(conversations, tokenizer, tools, row_tools, tool_format)
    # The template already placed the special tokens (BOS, role markers); adding them again would double them.
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
