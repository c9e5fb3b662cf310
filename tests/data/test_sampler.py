"""data.sampler: strata held at their shares, a curriculum that steps up and holds, exact resumes."""

import json
import math
import sys
import threading
from collections import Counter

import pytest

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import check_sampler
from posttrain.data import EpochSampler, PromptDataLoader, RLDataset
from posttrain.data.loader import row_of_uid
from posttrain.data.sampler import Curriculum, StratifiedSampler
from posttrain.errors import InputError
from posttrain.trainer.data_setup import build_sampler
from tests.data.helpers import verl_row, write_parquet

# 100 rows: 50 "a", 30 "b", 20 "c", interleaved
STRATA = [("a", "b", "a", "c", "a", "b", "a", "c", "a", "b")[i % 10] for i in range(100)]


def batches(sampler: StratifiedSampler, count: int) -> list[list[int]]:
    drawn = []
    for indices in sampler:  # the rest of the epoch; loop over epochs
        drawn.append(indices.tolist())
        if len(drawn) == count:
            return drawn
    return drawn + batches(sampler, count - len(drawn))


def test_each_stratum_holds_its_share_of_every_batch_and_of_the_run():
    sampler = StratifiedSampler(STRATA, 8, seed=3, shares={"c": 0.5})  # c: 4 a batch; a, b: the other half as 50:30
    wanted = {"a": 0.5 * 50 / 80, "b": 0.5 * 30 / 80, "c": 0.5}
    given = Counter()
    for k, batch in enumerate(batches(sampler, 40), start=1):
        counts = Counter(STRATA[row] for row in batch)
        assert sum(counts.values()) == 8 and len(set(batch)) == 8  # a batch never holds a row twice
        for name, share in wanted.items():
            assert abs(counts[name] - 8 * share) < 1  # its share rounded down or up, batch by batch
        given += counts
        assert all(abs(given[name] - 8 * k * share) < 1 for name, share in wanted.items())  # and over the run so far


def test_each_batch_is_allocated_by_largest_remainder_and_the_remainders_take_turns():
    """Weights as a mixture's: each stratum's count in a batch is its quota rounded down or up, and a
    remainder passed over in one batch wins a later one (three equal strata: 3 3 2, 3 2 3, 2 3 3)."""
    equal = StratifiedSampler(STRATA, 8, seed=0, shares={"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert [tuple(Counter(STRATA[r] for r in batch)[n] for n in "abc") for batch in batches(equal, 3)] == [(3, 3, 2), (3, 2, 3), (2, 3, 3)]
    weighted = StratifiedSampler(STRATA, 8, seed=0, shares={"a": 0.5, "b": 0.3, "c": 0.2})  # quotas 4, 2.4, 1.6
    drawn = [Counter(STRATA[r] for r in batch) for batch in batches(weighted, 10)]
    assert all(c["a"] == 4 and c["b"] in (2, 3) and c["c"] in (1, 2) and sum(c.values()) == 8 for c in drawn)
    assert sum(drawn, Counter()) == {"a": 40, "b": 24, "c": 16}  # 10 batches: exactly the weights
    uneven = {"a": 0.08, "b": 0.66, "c": 0.26}  # quotas 0.72, 5.94, 2.34 of 9: seat by seat, b once took 7
    for batch in batches(StratifiedSampler(STRATA, 9, seed=0, shares=uneven), 20):
        counts = Counter(STRATA[r] for r in batch)
        assert all(math.floor(9 * share) <= counts[name] <= math.ceil(9 * share) for name, share in uneven.items()), counts


def test_without_shares_strata_get_batches_in_proportion_to_their_rows():
    given = Counter(STRATA[row] for batch in batches(StratifiedSampler(STRATA, 10, seed=0), 10) for row in batch)
    assert given == {"a": 50, "b": 30, "c": 20}


def test_a_stratum_gives_each_of_its_rows_once_before_any_twice():
    sampler = StratifiedSampler(STRATA, 8, seed=1, shares={"c": 0.5})
    c_rows = [row for batch in batches(sampler, 30) for row in batch if STRATA[row] == "c"]  # 120 draws of 20 rows
    for start in range(0, 120, 20):
        assert sorted(c_rows[start:start + 20]) == sorted(i for i, s in enumerate(STRATA) if s == "c")
    assert c_rows[:20] != c_rows[20:40]  # each pass shuffled anew


def test_the_rows_drawn_so_far_are_counted_per_stratum_as_the_batches_hand_them_out():
    sampler = StratifiedSampler(STRATA, 8, seed=2, shares={"c": 0.5})  # c's 20 rows go round every 5 batches, a's 50 in 20
    seen: dict[str, set[int]] = {"a": set(), "b": set(), "c": set()}
    assert sampler.rows_drawn() == {"a": (0, 50), "b": (0, 30), "c": (0, 20)}
    for _ in range(30):
        for row in batches(sampler, 1)[0]:  # one batch at a time
            seen[STRATA[row]].add(row)
        assert sampler.rows_drawn() == {name: (len(rows), STRATA.count(name)) for name, rows in seen.items()}
    assert sampler.rows_drawn()["a"] == (50, 50)


def test_a_small_stratum_wrapping_inside_a_batch_never_repeats_a_row_in_it():
    strata = ["small"] * 5 + ["big"] * 95
    sampler = StratifiedSampler(strata, 8, seed=2, shares={"small": 0.5})  # 4 of its 5 rows a batch: it wraps often
    drawn = batches(sampler, 25)
    assert all(len(set(batch)) == 8 for batch in drawn)
    small = Counter(row for batch in drawn for row in batch if strata[row] == "small")
    assert set(small.values()) == {20}  # 100 draws over 5 rows: each exactly 20 times


def sampler_with_levels(seed: int = 0) -> tuple[StratifiedSampler, list[int]]:
    levels = [1 + i % 3 for i in range(90)]  # 30 rows per level 1, 2, 3
    strata = ["x" if i % 2 else "y" for i in range(90)]
    return StratifiedSampler(strata, 6, seed=seed, levels=levels, curriculum=Curriculum(threshold=0.75, window=2)), levels


def test_the_curriculum_holds_below_its_threshold_then_steps_up_level_by_level():
    sampler, levels = sampler_with_levels()
    seen_levels, reported = [], []
    accuracy_now = 0.5
    for step in range(1, 13):
        rows = next(iter(sampler)).tolist()  # drawn after the last step's accuracy was told, as the trainer does
        seen_levels.append({levels[r] for r in rows})
        if step == 4:
            accuracy_now = 0.9
        reported.append(sampler.observe(rows, [accuracy_now] * len(rows)))
    # steps 1-4 at level 1 (0.5, then the window (0.5, 0.9) = 0.7 < 0.75); step 5's window (0.9, 0.9) steps up;
    # level 2 needs a full window of its own: steps 6-7, then level 3, the last, stays
    assert seen_levels == [{1}] * 5 + [{2}] * 2 + [{3}] * 5
    assert [m["curriculum/level"] for m in reported] == [0] * 5 + [1] * 2 + [2] * 5
    assert reported[3]["curriculum/accuracy"] == pytest.approx(0.7)


def test_samples_of_an_earlier_level_do_not_count_for_the_current_one():
    sampler, levels = sampler_with_levels()
    level_one = [r for r in range(90) if levels[r] == 1][:6]
    level_two = [r for r in range(90) if levels[r] == 2][:6]
    sampler.observe(level_one, [1.0] * 6)
    sampler.observe(level_one, [1.0] * 6)
    assert sampler.level == 1
    told = sampler.observe(level_one, [1.0] * 6)  # late samples of level 1 (drawn before the step up, as async steps train)
    assert told == {"curriculum/level": 1.0}  # nothing of level 2 yet: no accuracy, and no step in its window
    told = sampler.observe(level_two, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert told["curriculum/accuracy"] == pytest.approx(0.5)  # level 2's own samples only (with level 1's: 0.75)
    assert sampler.level == 1  # one step of its own, the window holds two
    sampler.observe(level_two, [1.0] * 6)
    assert sampler.level == 2  # (0.5 + 1.0) / 2 = 0.75 over two steps of its own


@pytest.mark.parametrize("stop_after", [3, 7, 16])
def test_a_resumed_sampler_continues_exactly_with_its_curriculum(stop_after):
    def run(sampler, steps, start=0):
        out = []
        for step in range(start, steps):
            rows = next(iter(sampler)).tolist()
            accuracy = [float((row * 7 + step) % 10 < 8) for row in rows]  # mostly right: the level climbs
            out.append((rows, sampler.observe(rows, accuracy)))
        return out

    reference = run(sampler_with_levels(seed=4)[0], 20)
    first = sampler_with_levels(seed=4)[0]
    head = run(first, stop_after)
    resumed = sampler_with_levels(seed=4)[0]
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as trainer_state.json keeps it
    assert head + run(resumed, 20, start=stop_after) == reference
    assert reference[-1][1]["curriculum/level"] == 2  # the run did step up: the resume carried the level


def test_a_position_drawn_otherwise_is_refused_either_way():
    sampler = StratifiedSampler(STRATA, 8, seed=1)
    with pytest.raises(InputError, match="drawn otherwise"):
        sampler.load_state_dict({"epoch": 0, "index": 8, "num_samples": 100, "seed": 1})  # an EpochSampler's
    with pytest.raises(InputError, match=r"drawn otherwise: shares \{\} \(now \{'c': 0.5\}\)"):
        StratifiedSampler(STRATA, 8, seed=1, shares={"c": 0.5}).load_state_dict(sampler.state_dict())
    with pytest.raises(InputError, match="drawn by data.sampler"):  # the sampler taken out of the config
        EpochSampler(100, 8, seed=1).load_state_dict(sampler.state_dict())


def test_many_threads_drawing_while_the_curriculum_steps_up_never_mix_levels():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python can: the race, if any, shows at once
    try:
        sampler, levels = sampler_with_levels()
        drawn, errors = [], []

        def draw() -> None:
            try:
                for _ in range(200):
                    drawn.append(next(iter(sampler)).tolist())
            except Exception as error:  # noqa: BLE001 - the test reports whatever a thread hit
                errors.append(error)

        threads = [threading.Thread(target=draw) for _ in range(3)]
        for thread in threads:
            thread.start()
        for _ in range(400):
            sampler.observe(list(range(90)), [1.0] * 90)
            sampler.state_dict()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert not errors and len(drawn) == 600
    assert all(len({levels[row] for row in batch}) == 1 for batch in drawn)


def test_a_level_holding_only_strata_with_shares_takes_them_scaled_to_one():
    strata = ["x"] * 20 + ["x", "y"] * 10  # level 1: only x; level 2: x and y
    sampler = StratifiedSampler(strata, 4, shares={"x": 0.5}, levels=[1] * 20 + [2] * 20, curriculum=Curriculum(0.5, 1))
    assert sampler.shares == [{"x": 1.0}, {"x": 0.5, "y": 0.5}]
    with pytest.raises(InputError, match=r"level 2 has 3 training rows, fewer than a batch of 4 \(data.train_batch_size\)"):
        StratifiedSampler(["all"] * 23, 4, levels=[1] * 20 + [2] * 3, curriculum=Curriculum(0.5, 1))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"shares": {"d": 0.2}}, "no training row is in"),
    ({"shares": {"a": 0.6, "b": 0.6}}, "leaving nothing"),
    ({"shares": {"a": 0.5, "b": 0.3, "c": 0.2, }, "batch_size": 8}, None),
    ({"shares": {"a": 0.5, "b": 0.5}}, "leaving nothing for \\['c'\\]"),  # c would get nothing
    ({"shares": {"c": 1.0}}, "leaving nothing"),
])
def test_shares_that_cannot_be_met_are_refused(kwargs, message):
    batch_size = kwargs.pop("batch_size", 8)
    if message is None:
        StratifiedSampler(STRATA, batch_size, **kwargs)
        return
    with pytest.raises(InputError, match=message):
        StratifiedSampler(STRATA, batch_size, **kwargs)


def test_a_stratum_too_small_for_its_share_is_refused():
    with pytest.raises(InputError, match="stratum 'small' has 3 rows"):
        StratifiedSampler(["small"] * 3 + ["big"] * 97, 8, shares={"small": 0.5})


def test_a_curriculum_with_one_level_or_levels_the_rows_lack_is_refused():
    with pytest.raises(InputError, match="at least two levels"):
        StratifiedSampler(["x"] * 20, 4, levels=[1] * 20, curriculum=Curriculum(0.8, 2))
    with pytest.raises(InputError, match=r"no training row has level \[4\]"):
        StratifiedSampler(["x"] * 20, 4, levels=[1, 2] * 10, level_order=[1, 2, 4], curriculum=Curriculum(0.8, 2))
    with pytest.raises(InputError, match="threshold"):
        Curriculum(1.5, 2)


def test_the_config_check_refuses_a_schedule_that_cannot_work():
    config = PosttrainConfig()
    config.trainer.total_training_steps = 10
    sampler = config.data.sampler
    sampler.stratify_by, sampler.shares = "category", {"a": 1.2}
    sampler.curriculum.key, sampler.curriculum.threshold, sampler.curriculum.window = "extra_info.level", 1.5, 0
    problems = {p.key: p.message for p in check_sampler(config)}
    assert set(problems) == {"data.sampler.stratify_by", "data.sampler.shares", "data.sampler.curriculum.threshold",
                             "data.sampler.curriculum.window"}
    assert "data_source or extra_info.<field>" in problems["data.sampler.stratify_by"]
    assert "at least 1" in problems["data.sampler.curriculum.window"]
    assert check_sampler(PosttrainConfig()) == []


def test_the_loader_draws_by_the_config_and_names_each_draw_apart(tmp_path, tokenizer):
    rows = [verl_row(i, f"question {i}", data_source="rare" if i < 4 else "common") for i in range(16)]
    for i, row in enumerate(rows):
        row["extra_info"]["level"] = 1 + i % 2
    dataset = RLDataset(write_parquet(tmp_path / "a.parquet", rows), tokenizer)
    config = PosttrainConfig().data
    config.train_batch_size, config.sampler.stratify_by, config.sampler.shares = 4, "data_source", {"rare": 0.5}
    loader = PromptDataLoader(dataset, 4, tokenizer.pad_token_id, sampler=build_sampler(config, dataset))
    uids = [uid for batch in loader for uid in batch[keys.UID]]  # one epoch: 4 batches
    assert len(uids) == len(set(uids)) == 16  # the 4 rare rows come round twice in it, each draw its own id
    assert Counter(rows[row_of_uid(uid)]["data_source"] for uid in uids) == {"rare": 8, "common": 8}
    config.sampler.stratify_by, config.sampler.shares, config.sampler.curriculum.key = None, {}, "extra_info.level"
    sampler = build_sampler(config, dataset)
    assert sampler.levels == [1, 2] and {rows[r]["extra_info"]["level"] for r in next(iter(sampler))} == {1}


def test_development_rows_are_held_back_from_training_and_are_what_validation_and_eval_read(tmp_path, tokenizer):
    """``data.dev_size``: a seeded draw of training rows, never trained on, validated on in place of
    data.val_files (here a held-out file that must stay unread), the same rows for ``posttrain eval``."""
    from posttrain.trainer.data_setup import build_run_data

    train = write_parquet(tmp_path / "train.parquet", [verl_row(i, f"question {i}") for i in range(20)])
    held_out = write_parquet(tmp_path / "test.parquet", [verl_row(i, f"held-out {i}", split="test") for i in range(5)])
    config = PosttrainConfig().data
    config.train_files, config.val_files, config.train_batch_size, config.dev_size = [str(train)], [str(held_out)], 4, 6
    run = build_run_data(config, tokenizer)
    dev = [sample.extra_info["index"] for sample in run.val_dataset]
    trained = [sample.extra_info["index"] for sample in run.train.dataset]
    assert len(dev) == 6 and sorted(dev + trained) == list(range(20)) and not set(dev) & set(trained)
    assert dev != list(range(6)) and dev == sorted(dev)  # a draw, kept in the file's order
    assert [sample.extra_info["index"] for sample in build_run_data(config, tokenizer, training=False).val_dataset] == dev
    config.seed = 7
    assert [sample.extra_info["index"] for sample in build_run_data(config, tokenizer).val_dataset] != dev
    config.dev_size = 20
    with pytest.raises(InputError, match="at most 19 of the 20 training prompts"):
        build_run_data(config, tokenizer)


def test_dev_files_are_validated_on_beside_the_development_rows_and_never_trained_on(tmp_path, tokenizer):
    """``data.dev_files``: rows of a kind the training files lack (BFCL's dev_swapped.parquet), validated on after
    the data.dev_size rows, training unchanged; a bare name is a split of the built-in dataset; without
    data.dev_size the config check refuses them."""
    from posttrain.config.validate import validate_config
    from posttrain.trainer.data_setup import build_run_data, split_files

    train = write_parquet(tmp_path / "train.parquet", [verl_row(i, f"question {i}") for i in range(20)])
    extra = write_parquet(tmp_path / "dev_extra.parquet", [verl_row(100 + i, f"extra {i}", split="dev") for i in range(3)])
    config = PosttrainConfig().data
    config.train_files, config.train_batch_size, config.dev_size = [str(train)], 4, 6
    plain = build_run_data(config, tokenizer)
    config.dev_files = [str(extra)]
    run = build_run_data(config, tokenizer)
    indices = [sample.extra_info["index"] for sample in run.val_dataset]
    assert indices == [sample.extra_info["index"] for sample in plain.val_dataset] + [100, 101, 102]
    assert [s.extra_info["index"] for s in run.train.dataset] == [s.extra_info["index"] for s in plain.train.dataset]
    assert [sample.extra_info["index"] for sample in build_run_data(config, tokenizer, training=False).val_dataset] == indices
    config.builtin = "bfcl"
    config.dev_files = ["dev_extra.parquet"]
    assert split_files(config, "dev_files", tmp_path) == [str(tmp_path / "dev_extra.parquet")]
    config.dev_files = ["nowhere.parquet"]
    with pytest.raises(InputError, match=r"data.dev_files \['.*nowhere.parquet'\]: no such file, nor a split of the built-in dataset 'bfcl' \(dev_extra.parquet, train.parquet\)"):
        split_files(config, "dev_files", tmp_path)
    whole = PosttrainConfig()
    whole.data.dev_files = ["dev_swapped.parquet"]
    assert any(p.key == "data.dev_files" and "set data.dev_size" in p.message for p in validate_config(whole))
    whole.data.dev_size = 4
    assert not any(p.key == "data.dev_files" for p in validate_config(whole))


def test_development_rows_are_never_rows_an_sft_warm_up_learnt(tmp_path, tokenizer):
    """Rows marked ``extra_info.in_sft`` (a preparer's SFT items) stay in training whatever the draw, so
    the development rows measure questions the policy was not taught; too few others is refused."""
    from posttrain.trainer.data_setup import build_run_data

    rows = [verl_row(i, f"question {i}") for i in range(20)]
    for row in rows:
        row["extra_info"]["in_sft"] = row["extra_info"]["index"] % 4 != 0  # 5 rows the warm-up never saw
    config = PosttrainConfig().data
    config.train_files, config.train_batch_size = [str(write_parquet(tmp_path / "train.parquet", rows))], 4
    for seed, size in ((1, 3), (2, 5), (3, 4)):
        config.seed, config.dev_size = seed, size
        dev = [sample.extra_info["index"] for sample in build_run_data(config, tokenizer).val_dataset]
        assert len(dev) == size and all(index % 4 == 0 for index in dev)
    config.dev_size = 6
    with pytest.raises(InputError, match=r"at most 5 of the 20 training prompts \(15 of them are SFT items"):
        build_run_data(config, tokenizer)


def test_rows_kept_for_rl_alone_never_change_the_development_rows(tmp_path, tokenizer):
    """Rows marked ``extra_info.rl_only`` (kept for RL beyond the warm-up data's cap) are trained on and never
    held back: the development rows are the same as without them, wherever they sit in the file."""
    from posttrain.trainer.data_setup import build_run_data

    rows = [verl_row(i, f"question {i}") for i in range(20)]
    for row in rows:
        row["extra_info"]["in_sft"] = row["extra_info"]["index"] % 4 != 0
    longer = [verl_row(100 + i, f"a longer question {i}") for i in range(6)]
    for row in longer:
        row["extra_info"] |= {"in_sft": False, "rl_only": True}
    config = PosttrainConfig().data
    config.train_batch_size, config.seed, config.dev_size = 4, 3, 4

    def dev_and_train(name: str, file_rows: list[dict]) -> tuple[list[int], list[int]]:
        config.train_files = [str(write_parquet(tmp_path / name, file_rows))]
        data = build_run_data(config, tokenizer)
        return ([s.extra_info["index"] for s in data.val_dataset], sorted(s.extra_info["index"] for s in data.train.dataset.samples))

    dev, _ = dev_and_train("capped.parquet", rows)
    for name, file_rows in (("after.parquet", rows + longer), ("between.parquet", rows[:7] + longer + rows[7:])):
        with_longer, train = dev_and_train(name, file_rows)
        assert with_longer == dev
        assert set(range(100, 106)) <= set(train)
    config.dev_size = 6
    with pytest.raises(InputError, match=r"\(21 of them are SFT items or RL-only rows"):
        build_run_data(config, tokenizer)
