"""Tiny random causal language models in Hugging Face format: the fixture for integration tests.

A tiny model has real architecture code (llama or qwen2, both served by vLLM) and the real SmolLM2
tokenizer with its chat template, so prompts, chat formatting and decoding behave as with the
default model, while a forward pass costs almost nothing. Its vocabulary is the tokenizer's (49,152
tokens), so the embedding and head dominate its ~6.5M parameters.

Weights are random but deterministic in ``seed``. They are drawn with a larger spread than the
usual 0.02 (``init_std``) so the next-token distribution is peaked rather than almost uniform: the
gap between the best and second-best logit is then far above floating-point noise, and greedy
decoding gives the same tokens in transformers and in vLLM.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from posttrain.models.cache import build_atomically, models_cache_dir
from posttrain.models.smollm2 import smollm2_tokenizer_dir

TINY_ARCHS = ("llama", "qwen2")
# Bump when make_tiny_model's output changes, so cached tiny models are rebuilt.
_TINY_RECIPE_VERSION = 1
_MIN_HEAD_DIM = 32


def _tiny_config(arch: str, vocab_size: int, special_ids: dict[str, int | None], **sizes):
    from transformers import LlamaConfig, Qwen2Config

    if arch not in TINY_ARCHS:
        raise ValueError(f"Unknown tiny-model arch {arch!r}; use one of {TINY_ARCHS}.")
    config_class = LlamaConfig if arch == "llama" else Qwen2Config
    return config_class(vocab_size=vocab_size, **special_ids, **sizes)


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    init_std: float = 0.3,
    seed: int = 0,
) -> Path:
    """Write a random ``arch`` causal LM (float32) and the SmolLM2 tokenizer to ``out_dir``.

    The same arguments always give the same weights. ``out_dir`` is created (it may exist, but
    files there are overwritten). Returns ``out_dir`` as a ``Path``. The head size
    ``hidden_size // num_heads`` must be at least 32: vLLM's CPU attention has no smaller kernels.
    """
    if hidden_size % num_heads or hidden_size // num_heads < _MIN_HEAD_DIM:
        raise ValueError(
            f"hidden_size={hidden_size} with num_heads={num_heads} gives head size "
            f"{hidden_size / num_heads:g}; vLLM's CPU attention needs a whole head size of at "
            f"least {_MIN_HEAD_DIM} (e.g. hidden_size=64, num_heads=2)."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    tokenizer_dir = smollm2_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = _tiny_config(
        arch,
        vocab_size=len(tokenizer),
        special_ids={
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    # Copy the tokenizer files as they are: reloading and re-saving would be slower and could
    # rewrite them.
    for tokenizer_file in tokenizer_dir.iterdir():
        if tokenizer_file.is_file():
            shutil.copy2(tokenizer_file, out_dir / tokenizer_file.name)
    return out_dir


def cached_tiny_model(arch: str = "llama", seed: int = 0, **sizes) -> Path:
    """A tiny model made by :func:`make_tiny_model` once per argument set and reused from the cache.

    For tests and examples that do not care where the model lives; do not modify the directory.
    """
    size_tag = "-".join(f"{key}{value}" for key, value in sorted(sizes.items()))
    name = f"tiny-{arch}-seed{seed}-r{_TINY_RECIPE_VERSION}" + (f"-{size_tag}" if size_tag else "")
    final_dir = models_cache_dir() / name
    return build_atomically(
        final_dir, lambda tmp_dir: make_tiny_model(tmp_dir, arch=arch, seed=seed, **sizes)
    )
