"""GPU code paths: HF generate on CUDA, vLLM sleep mode. Skipped without an NVIDIA GPU."""

import pytest
import torch
from safetensors.torch import load_file

from posttrain.engines.rollout import GenerationParams, HFRolloutEngine

from .conftest import TEST_MAX_MODEL_LEN
from .reference import forward_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

GREEDY = GenerationParams(temperature=0, max_new_tokens=16)
# fp32 on both devices (PyTorch leaves TF32 matmuls off by default); measured ~1e-5.
GPU_CPU_LOGPROB_ATOL = 1e-3


def test_hf_engine_on_gpu_agrees_with_cpu(hf_engine, tiny_llama, tiny_llama_other, chat_prompts):
    gpu_engine = HFRolloutEngine(tiny_llama, device="cuda", max_model_len=TEST_MAX_MODEL_LEN)
    on_gpu, on_cpu = (
        gpu_engine.generate(chat_prompts, GREEDY),
        hf_engine.generate(chat_prompts, GREEDY),
    )
    for g, c in zip(on_gpu, on_cpu, strict=True):
        assert g.response_token_ids == c.response_token_ids
        assert (
            max(abs(a - b) for a, b in zip(g.logprobs, c.logprobs, strict=True))
            < GPU_CPU_LOGPROB_ATOL
        )

    sampled = gpu_engine.generate(chat_prompts, GenerationParams(n=2, max_new_tokens=8, seed=0))
    assert [(g.prompt_index, g.sample_index) for g in sampled] == [
        (p, s) for p in range(3) for s in range(2)
    ]
    reference = gpu_engine.model.cpu()
    for g in sampled:
        expected = forward_logprobs(reference, chat_prompts[g.prompt_index], g.response_token_ids)
        assert (
            max(abs(a - b) for a, b in zip(g.logprobs, expected.tolist(), strict=True))
            < GPU_CPU_LOGPROB_ATOL
        )
    reference.cuda()

    other = load_file(str(tiny_llama_other / "model.safetensors"))  # CPU tensors into a GPU model
    gpu_engine.load_weights(other.items(), version=1)
    other_on_cpu = HFRolloutEngine(tiny_llama_other, device="cpu", max_model_len=TEST_MAX_MODEL_LEN)
    assert [g.response_token_ids for g in gpu_engine.generate(chat_prompts, GREEDY)] == [
        g.response_token_ids for g in other_on_cpu.generate(chat_prompts, GREEDY)
    ]


def test_vllm_sleep_frees_gpu_memory_and_weights_reload_while_asleep(
    start_vllm, tiny_llama, chat_prompts
):
    pytest.importorskip("vllm")
    engine = start_vllm(tiny_llama, gpu_memory_utilization=0.3, kv_cache_bytes=None)
    before = [g.response_token_ids for g in engine.generate(chat_prompts, GREEDY)]
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake + (1 << 30), "sleep should free the KV cache"
    engine.load_weights(load_file(str(tiny_llama / "model.safetensors")).items(), version=1)
    engine.wake_up()
    after = engine.generate(chat_prompts, GREEDY)
    assert [g.response_token_ids for g in after] == before
    assert all(g.weight_version == 1 for g in after)
