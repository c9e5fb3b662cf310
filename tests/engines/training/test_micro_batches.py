"""Micro-batch splitting: sample counts, token budgets, equal counts across ranks; input building."""

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import build_model_inputs, lengths_to_mask
from posttrain.engines.training.inputs import check_batch
from posttrain.engines.training.micro_batches import (
    equalize_group_count,
    scatter_rows,
    split_by_count,
    split_by_token_budget,
)
from posttrain.protocol import Batch


def test_split_by_count_keeps_order_and_a_short_tail():
    assert split_by_count(5, 2) == [[0, 1], [2, 3], [4]]
    assert split_by_count(3, None) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        split_by_count(3, 0)


def test_token_budget_packs_first_fit_decreasing_within_the_budget():
    counts = torch.tensor([5, 9, 2, 7, 3, 4])
    groups = split_by_token_budget(counts, 10)
    # Longest first: 9 -> A; 7 -> B; 5 -> C; 4 -> C (9); 3 -> B (10); 2 -> D (A has 9, B 10, C 9).
    assert groups == [[1], [3, 4], [0, 5], [2]]
    assert all(counts[g].sum() <= 10 for g in groups)
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_token_budget_names_the_sample_that_does_not_fit():
    with pytest.raises(ValueError, match="sample 1 has 12 real tokens.*max_tokens=10"):
        split_by_token_budget(torch.tensor([3, 12]), 10)


def test_equalize_splits_the_largest_and_pads_when_rows_run_out():
    assert equalize_group_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert equalize_group_count([[0], [1]], 3) == [[0], [1], []]
    with pytest.raises(ValueError):
        equalize_group_count([[0], [1]], 1)


def test_scatter_rows_restores_the_original_order():
    pieces = [torch.tensor([[10.0], [30.0]]), torch.tensor([[20.0]]), torch.tensor([[99.0]])]
    out = scatter_rows(pieces, [[0, 2], [1], []], 3)
    assert out.flatten().tolist() == [10.0, 20.0, 30.0]


def test_build_model_inputs_by_hand():
    prompt_mask = lengths_to_mask(torch.tensor([3, 1]), 3, left_padded=True)
    response_attention = lengths_to_mask(torch.tensor([2, 3]), 3, left_padded=False)
    assert prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert response_attention.tolist() == [[1, 1, 0], [1, 1, 1]]
    inputs = build_model_inputs(torch.tensor([[5, 6, 7], [0, 0, 8]]), prompt_mask,
                                torch.tensor([[9, 10, 0], [11, 12, 13]]), response_attention)
    assert inputs[keys.INPUT_IDS].tolist() == [[5, 6, 7, 9, 10, 0], [0, 0, 8, 11, 12, 13]]
    assert inputs[keys.ATTENTION_MASK].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert inputs[keys.POSITION_IDS].tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]


def test_check_batch_names_the_missing_key_and_mismatched_responses():
    inputs = build_model_inputs(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), torch.ones(2, 3, dtype=torch.long),
                                torch.ones(2, 3))
    partial = Batch.from_dict({k: v for k, v in inputs.items() if k != keys.POSITION_IDS})
    with pytest.raises(KeyError, match="'position_ids'"):
        check_batch(partial, (keys.INPUT_IDS, keys.POSITION_IDS), "test")
    wrong = Batch.from_dict(inputs | {keys.RESPONSE_IDS: torch.zeros(2, 3, dtype=torch.long)})
    with pytest.raises(ValueError, match="responses differ from the last columns of input_ids"):
        check_batch(wrong, (keys.INPUT_IDS,), "test")
