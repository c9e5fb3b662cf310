"""EpochSampler / PromptDataLoader: seeded order, Batch layout, exact resume (mid-epoch and at a boundary)."""


import numpy as np
import pytest
import torch

from posttrain import keys
from posttrain.data import EpochSampler, PromptDataLoader, RLDataset
from tests.data.helpers import verl_row, write_parquet


def _run(sampler: EpochSampler, epochs: int) -> list[list[int]]:
    """Every batch of ``epochs`` epochs, as lists of indices."""
    out = []
    while sampler.epoch < epochs:
        out += [batch.tolist() for batch in sampler]
    return out


def test_order_is_a_seeded_permutation_per_epoch():
    a, b = EpochSampler(10, 5, seed=3), EpochSampler(10, 5, seed=3)
    assert _run(a, 2) == _run(b, 2)
    first, second = a.order(0), a.order(1)
    assert sorted(first.tolist()) == list(range(10)) and not np.array_equal(first, second)
    assert not np.array_equal(EpochSampler(10, 5, seed=4).order(0), first)
    assert EpochSampler(4, 2, shuffle=False).order(7).tolist() == [0, 1, 2, 3]


def test_batches_cover_epochs_and_drop_last():
    sampler = EpochSampler(7, 3, seed=0)
    batches = _run(sampler, 2)
    assert len(sampler) == 2 and len(batches) == 4 and all(len(b) == 3 for b in batches)
    assert batches[0] + batches[1] == sampler.order(0)[:6].tolist()
    keep = EpochSampler(7, 3, shuffle=False, drop_last=False)
    assert len(keep) == 3 and _run(keep, 1) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_rows_drawn_so_far_are_the_distinct_rows_handed_out_across_epochs(shuffle):
    sampler = EpochSampler(7, 3, seed=5, shuffle=shuffle)  # each epoch leaves one row out (drop_last)
    seen: set[int] = set()
    for epoch in range(4):
        for batch in sampler:
            seen.update(batch.tolist())
            assert sampler.rows_drawn() == {"all": (len(seen), 7)}, (epoch, sorted(seen))
    assert len(seen) == (7 if shuffle else 6)  # in order, row 6 is never drawn


def test_state_counts_the_batch_being_trained_on():
    sampler = EpochSampler(6, 2, shuffle=False)
    iterator = iter(sampler)
    next(iterator)
    assert sampler.state_dict()["epoch"] == 0 and sampler.state_dict()["index"] == 2
    next(iterator), next(iterator)  # the last batch of epoch 0 is out: the state points at epoch 1
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["index"]) == (1, 0)


@pytest.mark.parametrize("stop_after", [1, 3, 4, 6])  # mid-epoch, end of epoch 0, start of 1, end of 1
def test_resume_continues_exactly(stop_after):
    reference = _run(EpochSampler(9, 3, seed=11), 3)
    interrupted = EpochSampler(9, 3, seed=11)
    seen = []
    while len(seen) < stop_after:
        for batch in interrupted:
            seen.append(batch.tolist())
            if len(seen) == stop_after:
                break
    state = interrupted.state_dict()
    resumed = EpochSampler(9, 3, seed=11)
    resumed.load_state_dict(state)
    assert seen + _run(resumed, 3) == reference


def test_position_with_no_batch_left_moves_to_next_epoch():
    sampler = EpochSampler(7, 3, seed=0)
    sampler.load_state_dict({"epoch": 0, "index": 6, "num_samples": 7, "seed": 0})  # 1 left < batch of 3
    assert (sampler.epoch, sampler.state_dict()["index"]) == (1, 0)
    assert next(iter(sampler)).tolist() == sampler.order(1)[:3].tolist()


def test_state_from_another_dataset_is_refused():
    sampler = EpochSampler(8, 2, seed=0)
    with pytest.raises(ValueError, match="for 9 prompts .* this dataset has 8 prompts"):
        sampler.load_state_dict({"epoch": 0, "index": 2, "num_samples": 9, "seed": 0})
    with pytest.raises(ValueError, match="fewer than one batch of 5"):
        EpochSampler(4, 5)


def test_loader_batches_are_left_padded_prompt_batches(tmp_path, tokenizer):
    rows = [verl_row(0, "hi", data_source="gsm8k", ground_truth="3"), verl_row(1, "a much longer question " * 4)]
    dataset = RLDataset(write_parquet(tmp_path / "a.parquet", rows), tokenizer)
    loader = PromptDataLoader(dataset, 2, tokenizer.pad_token_id, shuffle=False)
    (batch,) = list(loader)
    ids, mask = batch[keys.PROMPT_IDS], batch[keys.PROMPT_MASK]
    short, long = dataset[0].prompt_ids, dataset[1].prompt_ids
    assert ids.shape == mask.shape == (2, len(long)) and ids.dtype == torch.int64
    pad = len(long) - len(short)
    assert ids[0, :pad].eq(tokenizer.pad_token_id).all() and ids[0, pad:].tolist() == short
    assert mask[0].tolist() == [0] * pad + [1] * len(short) and mask[1].eq(1).all()
    assert ids[1].tolist() == long
    assert list(batch[keys.DATA_SOURCE]) == ["gsm8k", "src"] and batch[keys.GROUND_TRUTH][0] == "3"
    assert batch[keys.RAW_PROMPT][0] == [{"role": "user", "content": "hi"}]
    assert batch[keys.EXTRA_INFO][1] == {"split": "train", "index": 1}
    assert list(batch[keys.UID]) == ["0:0", "0:1"]  # epoch 0, dataset rows 0 and 1: what trained_prompts.jsonl records
    (second_epoch,) = list(loader)
    assert list(second_epoch[keys.UID]) == ["1:0", "1:1"]


def test_loader_resume_yields_the_same_prompts(tmp_path, tokenizer):
    rows = [verl_row(i, f"question {i}") for i in range(6)]
    dataset = RLDataset(write_parquet(tmp_path / "a.parquet", rows), tokenizer)

    def contents(batch):
        return [m[0]["content"] for m in batch[keys.RAW_PROMPT]]

    full = PromptDataLoader(dataset, 2, tokenizer.pad_token_id, seed=5)
    reference = [contents(b) for _ in range(2) for b in full]
    first = PromptDataLoader(dataset, 2, tokenizer.pad_token_id, seed=5)
    seen = [contents(b) for b in first]  # exactly one epoch: the saved position is the boundary
    resumed = PromptDataLoader(dataset, 2, tokenizer.pad_token_id, seed=5)
    resumed.load_state_dict(first.state_dict())
    assert resumed.epoch == 1
    assert seen + [contents(b) for b in resumed] == reference
