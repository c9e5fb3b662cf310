"""make_tiny_model: both archs load in transformers, deterministic in the seed, peaked outputs."""

import pytest
import torch

from posttrain.models import load_causal_lm, load_tokenizer, make_tiny_model


@pytest.mark.parametrize(
    "arch, class_name", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")]
)
def test_tiny_model_loads_and_runs(tmp_path, arch, class_name):
    path = make_tiny_model(tmp_path / arch, arch=arch, num_layers=2, hidden_size=64)
    model = load_causal_lm(path)
    tokenizer = load_tokenizer(path)
    assert type(model).__name__ == class_name
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    assert logits.shape == (len(prompt), len(tokenizer))
    # Peaked on purpose (see posttrain.models.tiny): greedy must not hinge on float noise.
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median() > 0.05


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    first = load_causal_lm(make_tiny_model(tmp_path / "a", seed=3)).state_dict()
    again = load_causal_lm(make_tiny_model(tmp_path / "b", seed=3)).state_dict()
    other = load_causal_lm(make_tiny_model(tmp_path / "c", seed=4)).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first[name], other[name])


def test_head_size_too_small_for_vllm_cpu_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="head size 16"):
        make_tiny_model(tmp_path, hidden_size=64, num_heads=4)


def test_unknown_arch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="Unknown tiny-model arch 'gpt2'"):
        make_tiny_model(tmp_path, arch="gpt2")
