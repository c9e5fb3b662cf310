"""posttrain.metrics: each metric merges by the rule it was made with, whatever its name."""

import math
import statistics

import pytest

from posttrain.metrics import Kind, mean, merge, merge_collected, latest, maximum, minimum, total, values


def test_counts_add_means_weigh_by_their_counts_and_extremes_reduce():
    # two units: 4 samples with mean reward 0.25 (1 of 4), 12 samples with mean 0.75 (9 of 12)
    first = {"reward/samples": total(4), "reward/mean": mean(0.25, 4), "len/max": maximum(7), "len/min": minimum(3), "skips": latest(1)}
    second = {"reward/samples": total(12), "reward/mean": mean(0.75, 12), "len/max": maximum(5), "len/min": minimum(1), "skips": latest(2)}
    merged = merge([first, second])
    assert values(merged) == {"reward/samples": 16.0, "reward/mean": 10 / 16, "len/max": 7.0, "len/min": 1.0, "skips": 2.0}
    assert merged["reward/mean"].count == 16 and merged["reward/samples"].kind is Kind.SUM


def test_a_name_does_not_decide_the_rule():
    # named like a count, made as a mean: it is averaged; named like a mean, made as a count: it adds up
    merged = merge([{"agent/episodes": mean(2.0), "x/mean": total(3)}, {"agent/episodes": mean(4.0), "x/mean": total(5)}])
    assert values(merged) == {"agent/episodes": 3.0, "x/mean": 8.0}


def test_one_piece_is_kept_exactly_and_steps_of_one_match_the_plain_mean():
    assert merge([{"a": mean(0.1, 3)}])["a"] == mean(0.1, 3)
    steps = [0.1, 0.2, 0.7000000000000001]
    assert merge([{"loss": mean(v)} for v in steps])["loss"].value == statistics.fmean(steps)


def test_a_metric_missing_from_some_pieces_merges_over_those_that_have_it():
    assert values(merge([{"a": total(1)}, {"b": mean(2.0)}, {"a": total(2)}])) == {"a": 3.0, "b": 2.0}


def test_ranks_as_collected_merge_by_kind():
    collected = {"actor/pg_loss": [mean(1.0), mean(3.0)], "actor/skipped_total": [latest(2), latest(2)], "n": total(5)}
    assert values(merge_collected(collected)) == {"actor/pg_loss": 2.0, "actor/skipped_total": 2.0, "n": 5.0}


def test_a_metric_made_with_two_rules_is_refused():
    with pytest.raises(ValueError, match="'reward/errors' is made as \\['mean', 'sum'\\]"):
        merge([{"reward/errors": total(1)}, {"reward/errors": mean(0.5)}])


def test_a_mean_over_no_items_weighs_nothing_unless_no_piece_has_any():
    # a unit that checked no findings reports a placeholder 0 over 0: it must not pull 1.0 over 10 down
    assert merge([{"r": mean(0.0, 0)}, {"r": mean(1.0, 10)}])["r"].value == 1.0
    assert math.isclose(merge([{"r": mean(1.0, 0)}, {"r": mean(0.0, 0)}])["r"].value, 0.5)
