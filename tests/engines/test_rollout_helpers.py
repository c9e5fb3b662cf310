"""Pure pieces of the rollout engines, by hand: params validation, padding, where a row ends."""

import pytest
import torch

from posttrain.engines.rollout import GenerationParams, PromptTooLongError, check_prompts_fit
from posttrain.engines.rollout.hf_engine import left_pad, response_end
from posttrain.errors import InvalidSettings


def test_generation_params_reject_bad_values_all_at_once():
    with pytest.raises(InvalidSettings) as error:
        GenerationParams(max_new_tokens=0, temperature=-1, top_p=0, top_k=0, n=0)
    assert [p.key for p in error.value.problems] == ["max_new_tokens", "temperature", "top_p", "top_k", "n"]
    message = str(error.value)
    for fragment in ["max_new_tokens=0", "temperature=-1", "top_p=0", "top_k=0", "n=0"]:
        assert fragment in message


def test_stop_is_a_collection_not_a_string():
    with pytest.raises(ValueError, match="are collections"):
        GenerationParams(stop="\n")
    params = GenerationParams(stop=["\n"], stop_token_ids=[2])  # as a YAML config gives them
    assert params.stop == ("\n",) and params.stop_token_ids == (2,)


def test_greedy_means_temperature_zero():
    assert GenerationParams(temperature=0).greedy
    assert not GenerationParams(temperature=0.1).greedy


def test_check_prompts_fit_leaves_room_for_one_token():
    check_prompts_fit([[1] * 9], max_model_len=10)
    with pytest.raises(PromptTooLongError, match="Prompt 1 has 10 tokens"):
        check_prompts_fit([[1] * 9, [1] * 10], max_model_len=10)


def test_left_pad():
    input_ids, attention_mask = left_pad([[5, 6, 7], [8]], pad_token_id=0, device="cpu")
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert input_ids.dtype == torch.long


def decode(tokens):
    """Token t is the character chr(ord('a') + t); 25 stands for 'z' and 26 for a two-char 'xy'."""
    return "".join("xy" if t == 26 else chr(ord("a") + t) for t in tokens)


def test_response_end_stop_token_is_kept():
    assert response_end([0, 1, 2, 3], 10, {2}, (), decode) == (3, "stop")


def test_response_end_budget_and_generate_padding():
    # No stop: the budget (context or max_new_tokens) cuts the row.
    assert response_end([0, 1, 2, 3], 2, set(), (), decode) == (2, "length")
    assert response_end([0, 1, 2, 3], 10, set(), (), decode) == (4, "length")
    # A stop token beyond the budget does not count.
    assert response_end([0, 1, 2, 3], 2, {3}, (), decode) == (2, "length")


def test_response_end_stop_string_across_tokens():
    # "b" "c" completes "bc" at the third token; everything after (generate's padding) is dropped.
    assert response_end([0, 1, 2, 9, 9], 10, {9}, ("bc",), decode) == (3, "stop")
    # The earlier of a stop string and a stop token wins.
    assert response_end([0, 9, 1, 2], 10, {9}, ("bc",), decode) == (2, "stop")
    # A token whose text holds the whole stop string in its middle.
    assert response_end([0, 26, 1], 10, set(), ("x",), decode) == (2, "stop")
    # Beyond the budget a stop string does not count either.
    assert response_end([0, 1, 2], 2, set(), ("bc",), decode) == (2, "length")
