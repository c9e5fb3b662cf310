"""Shared rollout-engine fixtures: tiny models and engines started once per session.

Starting a vLLM engine on CPU takes seconds, so the read-only engines are session-scoped; a test
that loads weights builds its own engine (see test_weight_sync.py) so the shared ones stay intact.
"""

import time

import pytest

from posttrain.models import cached_tiny_model, load_tokenizer

# Small KV cache: a tiny model needs 512 bytes per token, so this holds ~130k tokens.
TEST_KV_CACHE_BYTES = 64 << 20
TEST_MAX_MODEL_LEN = 256


@pytest.fixture(scope="session")
def tiny_llama():
    return cached_tiny_model("llama", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_other():
    """Same architecture as ``tiny_llama``, other weights."""
    return cached_tiny_model("llama", seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2():
    return cached_tiny_model("qwen2", seed=0)


@pytest.fixture(scope="session")
def chat_prompts(tiny_llama):
    """Three chat prompts of different lengths, as token ids."""
    tokenizer = load_tokenizer(tiny_llama)
    questions = ["What is 2+3?", "Hi", "Write a short poem about the sea, please."]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        for q in questions
    ]


@pytest.fixture(scope="session")
def long_chat_prompt(tiny_llama):
    """A chat prompt of ~170 tokens: longer than one vLLM KV block (128 tokens on CPU)."""
    tokenizer = load_tokenizer(tiny_llama)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat after me: " + "one two three " * 40}],
        add_generation_prompt=True,
        return_dict=False,
    )
    assert 128 < len(prompt) < TEST_MAX_MODEL_LEN - 32
    return prompt


@pytest.fixture(scope="session")
def start_vllm():
    """``start(model_path, **kwargs) -> VLLMRolloutEngine`` sized for tests.

    Every engine started lives until the session ends: shutting one vLLM engine down tears down
    state that all in-process engines share (see posttrain.engines.rollout.vllm_engine). Start
    times are printed (shown with ``pytest -s``).
    """
    from posttrain.engines.rollout import VLLMRolloutEngine

    engines = []

    def start(model_path, **kwargs):
        # float32 on every device, so logprob tolerances and greedy equality with HF hold on GPU.
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("max_model_len", TEST_MAX_MODEL_LEN)
        kwargs.setdefault("kv_cache_bytes", TEST_KV_CACHE_BYTES)
        started = time.perf_counter()
        engines.append(VLLMRolloutEngine(model_path, **kwargs))
        print(
            f"\nvLLM engine for {model_path.name} started in {time.perf_counter() - started:.1f} s"
        )
        return engines[-1]

    yield start
    engines.clear()


@pytest.fixture(scope="session")
def vllm_engine(start_vllm, tiny_llama):
    """Read-only: never load weights into this engine."""
    return start_vllm(tiny_llama)


@pytest.fixture(scope="session")
def hf_engine(tiny_llama):
    """Read-only: never load weights into this engine."""
    from posttrain.engines.rollout import HFRolloutEngine

    return HFRolloutEngine(tiny_llama, device="cpu", max_model_len=TEST_MAX_MODEL_LEN)


@pytest.fixture(params=["vllm", "hf"])
def engine(request):
    """Each rollout engine on the tiny llama, for tests of the shared contract."""
    return request.getfixturevalue(f"{request.param}_engine")
