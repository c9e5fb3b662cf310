"""The rollout-engine contract (posttrain.engines.rollout.base), on vLLM and on HF generate."""

import json
import shutil

import pytest
import torch

from posttrain.engines.rollout import GenerationParams, HFRolloutEngine, PromptTooLongError
from posttrain.models import load_causal_lm, load_tokenizer

from .conftest import TEST_MAX_MODEL_LEN
from .reference import first_stop_string_end, forward_logprobs

GREEDY = GenerationParams(temperature=0, max_new_tokens=16)
# fp32 everywhere; measured differences are ~1e-5 (different kernels, padding, summation order).
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def reference_model(tiny_llama):
    return load_causal_lm(tiny_llama)


@pytest.fixture(scope="module")
def decode(tiny_llama):
    return load_tokenizer(tiny_llama).decode


def response_ids(generations):
    return [g.response_token_ids for g in generations]


def test_greedy_is_deterministic_and_independent_of_batching(engine, chat_prompts):
    together = response_ids(engine.generate(chat_prompts, GREEDY))
    assert response_ids(engine.generate(chat_prompts, GREEDY)) == together
    alone = [response_ids(engine.generate([prompt], GREEDY))[0] for prompt in chat_prompts]
    assert alone == together
    assert len(set(map(tuple, together))) == len(chat_prompts)


def test_samples_are_prompt_major_and_seeded(engine, chat_prompts):
    params = GenerationParams(temperature=1.0, n=3, max_new_tokens=8, seed=7)
    generations = engine.generate(chat_prompts, params)
    assert [(g.prompt_index, g.sample_index) for g in generations] == [
        (p, s) for p in range(len(chat_prompts)) for s in range(3)
    ]
    for p in range(len(chat_prompts)):
        samples = {tuple(g.response_token_ids) for g in generations if g.prompt_index == p}
        assert len(samples) == 3, "the n samples of a prompt must differ"
    assert response_ids(engine.generate(chat_prompts, params)) == response_ids(generations)
    other_seed = GenerationParams(temperature=1.0, n=3, max_new_tokens=8, seed=8)
    assert response_ids(engine.generate(chat_prompts, other_seed)) != response_ids(generations)


def test_a_prompt_with_its_own_seed_samples_alike_in_any_call(engine, chat_prompts):
    """Per-prompt seeds: what a prompt samples does not depend on the call's other prompts or its place."""
    params = GenerationParams(temperature=1.0, n=2, max_new_tokens=12, seed=0)
    seeds = [11, 22, 33]
    together = response_ids(engine.generate(chat_prompts, params, seeds))
    alone = [response_ids(engine.generate([prompt], params, [seed])) for prompt, seed in zip(chat_prompts, seeds)]
    reversed_ = response_ids(engine.generate(chat_prompts[::-1], params, seeds[::-1]))
    assert together == [ids for pair in alone for ids in pair]
    assert reversed_ == [ids for pair in alone[::-1] for ids in pair]
    assert response_ids(engine.generate(chat_prompts[:1], params, [12])) != alone[0], "another seed, other samples"
    assert together != response_ids(engine.generate(chat_prompts, params)), "without seeds the call's seed decides"
    with pytest.raises(ValueError, match="one seed per prompt"):
        engine.generate(chat_prompts, params, seeds[:2])


def test_a_repeated_prompt_gets_different_samples(engine, chat_prompts):
    params = GenerationParams(temperature=1.0, max_new_tokens=8, seed=1)
    first, second = response_ids(engine.generate([chat_prompts[0]] * 2, params))
    assert first != second


def test_greedy_with_n_gives_n_identical_copies(engine, chat_prompts):
    generations = engine.generate(
        chat_prompts[:2], GenerationParams(temperature=0, n=2, max_new_tokens=6)
    )
    assert [(g.prompt_index, g.sample_index) for g in generations] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    ids = response_ids(generations)
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]


def test_max_new_tokens_ends_with_length(engine, chat_prompts):
    params = GenerationParams(temperature=1.0, max_new_tokens=5, ignore_eos=True, seed=0)
    for g in engine.generate(chat_prompts, params):
        assert (len(g.response_token_ids), len(g.logprobs), g.finish_reason) == (5, 5, "length")


def test_stop_token_id_ends_response_and_is_kept(engine, chat_prompts):
    free = engine.generate([chat_prompts[0]], GREEDY)[0].response_token_ids
    stop_id = free[4]
    end = free.index(stop_id) + 1
    stopped = engine.generate(
        [chat_prompts[0]],
        GenerationParams(temperature=0, max_new_tokens=16, stop_token_ids=(stop_id,)),
    )[0]
    assert stopped.response_token_ids == free[:end]
    assert stopped.finish_reason == "stop"


def test_stop_string_ends_at_the_completing_token(engine, chat_prompts, decode):
    free = engine.generate([chat_prompts[2]], GREEDY)[0].response_token_ids
    # A string that first appears in the middle of the greedy text.
    stop = decode(free[:7])[-3:]
    end = first_stop_string_end(free, stop, decode)
    assert end is not None and end < len(free)
    stopped = engine.generate(
        [chat_prompts[2]], GenerationParams(temperature=0, max_new_tokens=16, stop=(stop,))
    )[0]
    assert stopped.response_token_ids == free[:end], "ids must be exactly the sampled ones"
    assert stopped.finish_reason == "stop"
    assert len(stopped.logprobs) == end


@pytest.mark.parametrize("temperature, top_k", [(0.0, None), (1.0, None), (0.7, None), (1.3, 20)])
def test_behaviour_logprobs_match_a_forward_pass(
    engine, reference_model, chat_prompts, temperature, top_k
):
    params = GenerationParams(
        temperature=temperature, top_k=top_k, n=2, max_new_tokens=12, seed=3, ignore_eos=True
    )
    for g in engine.generate(chat_prompts, params):
        expected = forward_logprobs(
            reference_model,
            chat_prompts[g.prompt_index],
            g.response_token_ids,
            temperature=temperature or 1.0,  # greedy reports the untempered distribution
            top_k=top_k,
        )
        assert (
            max(abs(a - b) for a, b in zip(g.logprobs, expected.tolist(), strict=True))
            < LOGPROB_ATOL
        )


def test_logprobs_can_be_turned_off(engine, chat_prompts):
    generations = engine.generate(chat_prompts, GenerationParams(max_new_tokens=4, logprobs=False))
    assert all(g.logprobs is None and len(g.response_token_ids) > 0 for g in generations)


def test_prompt_longer_than_context_is_refused_with_the_fix(engine, chat_prompts):
    too_long = [5] * TEST_MAX_MODEL_LEN
    with pytest.raises(PromptTooLongError) as error:
        engine.generate([chat_prompts[0], too_long], GREEDY)
    message = str(error.value)
    assert f"Prompt 1 has {TEST_MAX_MODEL_LEN} tokens" in message
    assert f"max_model_len={TEST_MAX_MODEL_LEN}" in message and "max_prompt_length" in message
    with pytest.raises(ValueError, match="Prompt 0 is empty"):
        engine.generate([[]], GREEDY)


def test_response_is_cut_where_the_context_ends(engine):
    prompt = [5] * (TEST_MAX_MODEL_LEN - 3)
    g = engine.generate([prompt], GenerationParams(max_new_tokens=10, ignore_eos=True, seed=0))[0]
    assert (len(g.response_token_ids), g.finish_reason) == (3, "length")


def test_sleep_and_wake_keep_the_engine_usable(engine, chat_prompts):
    before = response_ids(engine.generate(chat_prompts, GREEDY))
    engine.sleep()
    engine.wake_up()
    assert response_ids(engine.generate(chat_prompts, GREEDY)) == before
    assert engine.version == 0


@pytest.fixture(scope="module")
def extra_eos_engines(start_vllm, tiny_llama, chat_prompts, reference_model, tmp_path_factory):
    """Both engines on a copy of the tiny model whose generation config adds, as a second eos,
    the token that greedy decoding of ``chat_prompts[0]`` starts with; returns (engines, token)."""
    with torch.no_grad():
        first_token = int(reference_model(torch.tensor([chat_prompts[0]])).logits[0, -1].argmax())
    model_dir = tmp_path_factory.mktemp("extra_eos") / "model"
    shutil.copytree(tiny_llama, model_dir)
    config_path = model_dir / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token_id"] = [config["eos_token_id"], first_token]
    config_path.write_text(json.dumps(config))
    engines = [
        start_vllm(model_dir),
        HFRolloutEngine(model_dir, device="cpu", max_model_len=TEST_MAX_MODEL_LEN),
    ]
    return engines, first_token


def test_eos_from_generation_config_stops_unless_ignored(extra_eos_engines, chat_prompts):
    engines, eos = extra_eos_engines
    for engine in engines:
        stopped = engine.generate([chat_prompts[0]], GREEDY)[0]
        assert (stopped.response_token_ids, stopped.finish_reason) == ([eos], "stop")
        params = GenerationParams(temperature=0, max_new_tokens=6, ignore_eos=True)
        ignored = engine.generate([chat_prompts[0]], params)[0]
        assert ignored.response_token_ids[0] == eos
        assert (len(ignored.response_token_ids), ignored.finish_reason) == (6, "length")


def test_hf_generate_takes_as_many_rows_a_call_as_its_scores_budget_allows(tiny_llama, chat_prompts, monkeypatch):
    """HF generate only: one call per batch of rows, by default as many rows as keep the call's processed
    scores (rows x max_new_tokens x vocab float32) under SCORES_BUDGET_BYTES; a prompt's n rows stay together."""
    from posttrain.engines.rollout import hf_engine

    engine = HFRolloutEngine(tiny_llama, device="cpu", max_model_len=TEST_MAX_MODEL_LEN)
    calls = []
    generate = engine.model.generate
    monkeypatch.setattr(engine.model, "generate", lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw))
    params = GenerationParams(temperature=1.0, max_new_tokens=4, n=2, seed=0)
    assert len(chat_prompts) >= 3
    engine.generate(chat_prompts, params)
    assert calls == [2 * len(chat_prompts)]
    vocabulary = engine.model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(hf_engine, "SCORES_BUDGET_BYTES", 4 * vocabulary * 4 * 3)  # three rows of 4 steps
    calls.clear()
    engine.generate(chat_prompts, params)
    assert calls == [2] * len(chat_prompts)  # 3 rows fit, a prompt's 2 rows go together: one prompt a call
    explicit = HFRolloutEngine(tiny_llama, device="cpu", max_model_len=TEST_MAX_MODEL_LEN, max_batch_size=4)
    generate_explicit = explicit.model.generate
    monkeypatch.setattr(explicit.model, "generate", lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate_explicit(**kw))
    calls.clear()
    explicit.generate(chat_prompts, params)
    assert calls[0] == 4 and sum(calls) == 2 * len(chat_prompts)
