"""Weights loaded in place change an engine's output to exactly the loaded model's output."""

import pytest
import torch
from safetensors.torch import load_file

from posttrain.engines.rollout import GenerationParams, HFRolloutEngine

from .conftest import TEST_MAX_MODEL_LEN

GREEDY = GenerationParams(temperature=0, max_new_tokens=16)


def weights_of(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def greedy(engine, prompts):
    return [g.response_token_ids for g in engine.generate(prompts, GREEDY)]


def start_hf(model_dir):
    return HFRolloutEngine(model_dir, device="cpu", max_model_len=TEST_MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def vllm_engine_to_update(start_vllm, tiny_llama):
    return start_vllm(tiny_llama)


@pytest.fixture(scope="module")
def vllm_compiled_engine_to_update(start_vllm, tiny_llama):
    """Compiled (actor_rollout_ref.rollout.enforce_eager=false): a reload must reach the compiled graphs too."""
    return start_vllm(tiny_llama, enforce_eager=False)


@pytest.fixture(scope="module")
def hf_engine_to_update(tiny_llama):
    return start_hf(tiny_llama)


@pytest.fixture(params=["vllm", pytest.param("vllm_compiled", marks=pytest.mark.slow), "hf"])
def engine_to_update(request):
    return request.getfixturevalue(f"{request.param}_engine_to_update")


@pytest.fixture(scope="module")
def prompts(chat_prompts, long_chat_prompt):
    # The long prompt fills a whole KV block, so a prefix cache kept across a weight load would
    # feed it stale keys and values.
    return [*chat_prompts, long_chat_prompt]


@pytest.fixture(scope="module")
def other_model_greedy(start_vllm, tiny_llama_other, prompts):
    """Greedy responses of a vLLM engine started fresh from the other model."""
    return greedy(start_vllm(tiny_llama_other), prompts)


def test_loading_another_models_weights_gives_that_models_output(
    engine_to_update, tiny_llama, tiny_llama_other, other_model_greedy, prompts
):
    engine = engine_to_update
    own_greedy = greedy(engine, prompts)
    assert own_greedy != other_model_greedy

    start = engine.version
    # A generator, as a trainer streams its state dict.
    streamed = ((name, tensor) for name, tensor in weights_of(tiny_llama_other).items())
    engine.load_weights(streamed, start + 1)
    assert engine.version == start + 1
    generations = engine.generate(prompts, GREEDY)
    assert [g.response_token_ids for g in generations] == other_model_greedy
    assert all(g.weight_version == start + 1 for g in generations)

    engine.load_weights(weights_of(tiny_llama).items(), start + 2)
    assert greedy(engine, prompts) == own_greedy


def test_weights_can_arrive_one_decoder_layer_at_a_time(
    engine_to_update, tiny_llama, tiny_llama_other, other_model_greedy, prompts
):
    def layer_of(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:3]) if parts[1] == "layers" else "rest"

    groups: dict[str, list] = {}
    for name, tensor in weights_of(tiny_llama_other).items():
        groups.setdefault(layer_of(name), []).append((name, tensor))
    assert len(groups) == 3  # two decoder layers and the rest (embedding, final norm, head)
    version = engine_to_update.version + 1
    for group in groups.values():
        engine_to_update.load_weights(group, version)
    assert greedy(engine_to_update, prompts) == other_model_greedy
    engine_to_update.load_weights(weights_of(tiny_llama).items(), version + 1)


def test_perturbed_weights_reach_vllm_exactly(
    vllm_engine_to_update, hf_engine_to_update, tiny_llama, prompts
):
    """vLLM given perturbed weights generates what HF generate does with the same weights."""
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        name: tensor + 0.1 * tensor.std() * torch.randn(tensor.shape, generator=generator)
        for name, tensor in weights_of(tiny_llama).items()
    }
    before = greedy(vllm_engine_to_update, prompts)
    version = max(vllm_engine_to_update.version, hf_engine_to_update.version) + 1
    vllm_engine_to_update.load_weights(perturbed.items(), version)
    hf_engine_to_update.load_weights(perturbed.items(), version)
    after = greedy(vllm_engine_to_update, prompts)
    assert after != before
    assert after == greedy(hf_engine_to_update, prompts)
    vllm_engine_to_update.load_weights(weights_of(tiny_llama).items(), version + 1)
    hf_engine_to_update.load_weights(weights_of(tiny_llama).items(), version + 1)


def test_versions_never_go_backwards(engine_to_update, tiny_llama):
    engine_to_update.load_weights(weights_of(tiny_llama).items(), engine_to_update.version + 5)
    with pytest.raises(ValueError, match="older than the engine's version"):
        engine_to_update.load_weights(weights_of(tiny_llama).items(), engine_to_update.version - 1)


def test_hf_engine_names_unknown_and_misshapen_weights(hf_engine_to_update):
    version = hf_engine_to_update.version
    with pytest.raises(KeyError, match="'model.no_such.weight' is not a parameter"):
        hf_engine_to_update.load_weights([("model.no_such.weight", torch.zeros(1))], version)
    with pytest.raises(ValueError, match=r"has shape \(3,\)"):
        hf_engine_to_update.load_weights([("model.norm.weight", torch.zeros(3))], version)


def test_float32_weights_reach_a_bfloat16_engine_as_if_it_had_started_from_them(start_vllm, tiny_llama, tiny_llama_other, prompts):
    """The trainer streams float32 weights; a bfloat16 rollout engine (``rollout.dtype=auto`` on
    hardware with native bf16) casts them on load, ending where an engine started on them would."""
    engine = start_vllm(tiny_llama, dtype="bfloat16")
    fresh_other = greedy(start_vllm(tiny_llama_other, dtype="bfloat16"), prompts)
    assert greedy(engine, prompts) != fresh_other
    engine.load_weights(weights_of(tiny_llama_other).items(), engine.version + 1)
    assert greedy(engine, prompts) == fresh_other
