"""Batch: every operation on small batches whose contents can be read off by eye."""

import pickle

import numpy as np
import pytest
import torch

from posttrain.protocol import Batch, BatchError


def make(n: int = 4) -> Batch:
    return Batch.from_dict(
        {"ids": torch.arange(n * 3).view(n, 3), "score": torch.arange(n, dtype=torch.float32)},
        {"name": [f"s{i}" for i in range(n)]},
        {"temperature": 1.0},
    )


def test_len_and_getitem():
    b = make(4)
    assert len(b) == 4
    assert b["name"].tolist() == ["s0", "s1", "s2", "s3"]
    assert b["ids"][1].tolist() == [3, 4, 5]
    with pytest.raises(KeyError, match="no column 'nope'"):
        b["nope"]


def test_mismatched_lengths_are_refused_with_each_length_named():
    with pytest.raises(BatchError, match=r"tensor 'a': 3, tensor 'b': 2"):
        Batch.from_dict({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(BatchError, match="non-tensor 'n': 2"):
        Batch.from_dict({"a": torch.zeros(3)}, {"n": ["x", "y"]})


def test_select_and_pop():
    b = make()
    s = b.select(["ids", "name"], meta_keys=[])
    assert s.keys() == ["ids", "name"] and s.meta == {}
    popped = b.pop(["score"])
    assert popped.keys() == ["score"] and "score" not in b
    with pytest.raises(KeyError, match="cannot select"):
        b.select(["score"])


def test_union_merges_and_refuses_conflicts():
    b = make()
    extra = Batch.from_dict({"reward": torch.ones(4)}, meta={"step": 3})
    u = b.union(extra)
    assert set(u.keys()) == {"ids", "score", "name", "reward"} and u.meta["step"] == 3
    same = b.select(["ids"])
    assert torch.equal(b.union(same)["ids"], b["ids"])  # identical shared key is fine
    clash = Batch.from_dict({"ids": torch.zeros(4, 3, dtype=torch.long)})
    with pytest.raises(BatchError, match="tensor 'ids' differs"):
        b.union(clash)
    with pytest.raises(BatchError, match="meta 'temperature' differs"):
        b.union(Batch.from_dict({"x": torch.zeros(4)}, meta={"temperature": 0.5}))


def test_repeat_interleaved_and_tiled():
    b = make(2)
    inter = b.repeat(3)
    assert inter["name"].tolist() == ["s0", "s0", "s0", "s1", "s1", "s1"]
    assert inter["score"].tolist() == [0, 0, 0, 1, 1, 1]
    tiled = b.repeat(2, interleave=False)
    assert tiled["name"].tolist() == ["s0", "s1", "s0", "s1"]
    assert tiled["ids"][:, 0].tolist() == [0, 3, 0, 3]


def test_chunk_split_pad_unpad():
    b = make(5)
    with pytest.raises(BatchError, match="pad_to_divisor"):
        b.chunk(2)
    padded, pad = b.pad_to_divisor(4)
    assert (len(padded), pad) == (8, 3)
    assert padded["name"].tolist()[5:] == ["s0", "s1", "s2"]  # padding copies the first rows
    chunks = padded.chunk(4)
    assert [len(c) for c in chunks] == [2, 2, 2, 2]
    back = Batch.concat(chunks).unpad(pad)
    assert back["name"].tolist() == b["name"].tolist()
    assert torch.equal(back["ids"], b["ids"])
    assert [len(p) for p in b.split(2)] == [2, 2, 1]
    assert b.pad_to_divisor(5)[1] == 0


def test_concat_merges_metrics_and_checks_keys():
    a = make(2).with_metrics({"loss": 1.0})
    b = make(2).with_metrics({"loss": [2.0, 3.0]})
    c = Batch.concat([a, b])
    assert c.metrics == {"loss": [1.0, 2.0, 3.0]}
    assert c.meta["temperature"] == 1.0
    with pytest.raises(BatchError, match="key sets differ"):
        Batch.concat([a, a.select(["ids"])])


def test_reorder_and_index():
    b = make(4)
    r = b.reorder([3, 1, 0, 2])
    assert r["name"].tolist() == ["s3", "s1", "s0", "s2"]
    assert r["score"].tolist() == [3, 1, 0, 2]
    with pytest.raises(BatchError, match="permutation"):
        b.reorder([0, 0, 1, 2])
    picked = b.index(torch.tensor([True, False, True, False]))
    assert picked["name"].tolist() == ["s0", "s2"]


def test_minibatches_cover_every_sample_once_per_epoch_and_follow_the_seed():
    b = make(8)
    epochs = list(b.minibatches(4, epochs=2, seed=7))
    assert len(epochs) == 4
    for epoch in (epochs[:2], epochs[2:]):
        assert sorted(sum((m["score"].tolist() for m in epoch), [])) == list(range(8))
    again = list(b.minibatches(4, epochs=2, seed=7))
    assert all(torch.equal(x["score"], y["score"]) for x, y in zip(epochs, again))
    other = list(b.minibatches(4, epochs=1, seed=8))
    assert not all(torch.equal(x["score"], y["score"]) for x, y in zip(epochs, other))
    with pytest.raises(BatchError, match="must divide"):
        next(b.minibatches(3))


def test_minibatches_by_group_keep_each_group_whole_and_side_by_side():
    b = make(12)
    group_ids = torch.tensor([5, 5, 5, 1, 1, 1, 9, 9, 9, 2, 2, 2])
    orders = []
    for seed in range(6):
        scores = [[int(x) for x in m["score"].tolist()] for m in b.minibatches(6, epochs=2, seed=seed, group_ids=group_ids)]
        for epoch in (scores[:2], scores[2:]):
            assert sorted(sum(epoch, [])) == list(range(12))
        for mini_batch in scores:  # two whole groups each, in their own order
            groups = [mini_batch[i:i + 3] for i in (0, 3)]
            assert all(g == list(range(g[0], g[0] + 3)) and g[0] % 3 == 0 for g in groups)
        orders.append(scores[0])
    assert len({tuple(o) for o in orders}) > 1  # the groups are shuffled
    with pytest.raises(BatchError, match="one id per sample"):
        next(b.minibatches(6, group_ids=group_ids[:4]))


def test_pickle_round_trip_keeps_dtypes_and_writes_buffers_out_of_band():
    b = Batch.from_dict(
        {"ids": torch.arange(1000).view(10, 100), "h": torch.randn(10, 4).to(torch.bfloat16)},
        {"obj": [{"k": i} for i in range(10)]},
        {"v": 1},
    )
    buffers = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 2000  # 8 KB of ids travel out of band, not inside the pickle stream
    back = pickle.loads(data, buffers=buffers)
    assert back["h"].dtype == torch.bfloat16 and torch.equal(back["h"], b["h"])
    assert torch.equal(back["ids"], b["ids"]) and back["obj"][3] == {"k": 3} and back.meta == {"v": 1}


def test_empty_batch_and_bad_arguments():
    assert len(Batch()) == 0
    assert len(make().index([])) == 0
    with pytest.raises(BatchError, match="repeat times"):
        make().repeat(0)
    with pytest.raises(BatchError, match="0-d tensor"):
        Batch.from_dict({"x": torch.tensor(1.0)})
    with pytest.raises(BatchError, match="1-D"):
        Batch.from_dict({}, {"x": np.zeros((2, 2), dtype=object)})


def test_pad_rows_right_and_left_with_a_fill():
    from posttrain.protocol import pad_rows

    assert pad_rows([[1, 2], [3], []], 3, 9).tolist() == [[1, 2, 9], [3, 9, 9], [9, 9, 9]]
    assert pad_rows([[1, 2], [3]], 3, 0, left=True).tolist() == [[0, 1, 2], [0, 0, 3]]
    assert pad_rows([[-0.5]], 2, dtype=torch.float32).tolist() == [[-0.5, 0.0]]
    with pytest.raises(BatchError, match="row 1 has 3 values, more than the width 2"):
        pad_rows([[1], [1, 2, 3]], 2)


def test_a_count_of_minibatches_cuts_between_groups_whose_sizes_vary_and_follows_the_groups():
    """Groups of an agent program vary in samples (prefix breaks): ``count`` mini-batches per epoch, cut
    where a group ends, as even as the groups allow; a mini-batch is never empty."""
    from posttrain.keys import GROUP_COUNT
    from posttrain.protocol import mini_batch_count

    b = make(10)
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])  # 3 + 2 + 4 + 1 samples
    for seed in range(5):
        pieces = [[int(x) for x in m["score"].tolist()] for m in b.minibatches(0, count=2, seed=seed, group_ids=group_ids)]
        assert len(pieces) == 2 and sorted(sum(pieces, [])) == list(range(10))
        for piece in pieces:  # whole groups only
            assert all(set(group_ids[piece].tolist()) & set(group_ids[other].tolist()) == set() for other in pieces if other is not piece)
        assert abs(len(pieces[0]) - len(pieces[1])) <= 4
    one_group = list(make(3).minibatches(0, count=3, group_ids=torch.tensor([7, 7, 7])))
    assert [len(m) for m in one_group] == [1, 1, 1]  # cut inside the group rather than leave a step empty
    with pytest.raises(BatchError, match="4 mini-batches cannot be made of 3 samples"):
        next(make(3).minibatches(0, count=4))
    assert mini_batch_count(make(4), 2) is None  # whole groups of rollout.n: split by size
    assert mini_batch_count(Batch(meta={GROUP_COUNT: 8}), 4) == 2 and mini_batch_count(Batch(meta={GROUP_COUNT: 3}), 4) == 1
