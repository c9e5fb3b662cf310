"""95 % intervals of accuracies (Wilson) and of the difference of two evaluations of the same items
(paired bootstrap), checked against values computed by hand, and `posttrain compare` on two files."""

import json
import math

import pytest

from posttrain.cli.compare import compare_evaluations
from posttrain.trainer.intervals import interval_names, paired_difference, wilson, with_interval


def wilson_by_hand(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k, n", [(0, 10), (5, 10), (10, 10), (21, 64), (128, 128), (42, 128)])
def test_wilson_matches_the_formula(k, n):
    low, high = wilson(k, n)
    assert low == pytest.approx(wilson_by_hand(k, n)[0], abs=1e-6) and high == pytest.approx(wilson_by_hand(k, n)[1], abs=1e-6)
    assert 0 <= low <= k / n <= high <= 1


def test_a_seven_point_gain_on_64_items_is_inside_the_noise():
    """The issue's case: 0.41 → 0.48 on 64 cases; the two intervals overlap widely."""
    before, after = wilson(26, 64), wilson(31, 64)
    assert before[1] > after[0] + 0.1
    assert math.isnan(wilson(0, 0)[0])


def test_the_paired_interval_of_the_difference():
    same = [1.0, 0.0, 1.0, 1.0]
    assert paired_difference(same, same) == (0.0, 0.0, 0.0)
    # 40 items: B gets right 10 that A got wrong, and both agree on the rest
    a = [0.0] * 20 + [1.0] * 20
    b = [1.0] * 10 + [0.0] * 10 + [1.0] * 20
    difference, low, high = paired_difference(a, b)
    assert difference == 0.25 and 0.1 <= low < 0.25 < high <= 0.4  # about ±1.96 × 0.068, the standard error
    # pairing is what makes it narrow: the unpaired intervals of A (0.50) and B (0.75) overlap
    assert wilson(sum(a), 40)[1] > wilson(sum(b), 40)[0]
    assert paired_difference(a, b, seed=1)[1:] == pytest.approx((low, high), abs=0.03)  # stable across resamplings
    with pytest.raises(ValueError, match="no items"):
        paired_difference([], [])


def test_the_intervals_are_95_percent_ones():
    """Pinned at 95 %, with numbers a human can check: at 90 % each one below would be narrower."""
    # Wilson, z = 1.96: 5 of 10 → 0.5 ± 1.96·√(0.25/10 + 1.96²/400) / (1 + 1.96²/10) = [0.2366, 0.7634]
    # (at 90 %: [0.2693, 0.7307]); the docs' example, 32 of 64, is [0.38, 0.62]
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert [round(bound, 2) for bound in wilson(32, 64)] == [0.38, 0.62]
    # 16 items, 8 improved by 1 and 8 unchanged: a resample's mean difference is K/16 with K ~ Binomial(16, 1/2).
    # P(K ≤ 3) = 697/65536 = 0.011 < 0.025 ≤ P(K ≤ 4) = 2517/65536 = 0.038, so the 2.5th percentile is 4/16 and,
    # by symmetry, the 97.5th 12/16; at 90 % the 5th percentile would be 5/16 (P(K ≤ 5) = 6885/65536 = 0.105).
    difference, low, high = paired_difference([0.0] * 16, [1.0] * 8 + [0.0] * 8)
    assert (difference, low, high) == (0.5, 4 / 16, 12 / 16)


def test_interval_names_and_text():
    assert interval_names("val/x/acc/mean@1") == ("val/x/acc_low/mean@1", "val/x/acc_high/mean@1")
    metrics = {"val/x/acc/mean@1": 0.5, "val/x/acc_low/mean@1": 0.25, "val/x/acc_high/mean@1": 0.75}
    assert with_interval(metrics, "val/x/acc/mean@1") == "0.500 [0.250, 0.750]"
    assert with_interval({"val/x/acc/mean@1": 0.5}, "val/x/acc/mean@1") == "0.500"


def write_episodes(path, successes, hops):
    with open(path, "w") as out:
        for item, (success, hop) in enumerate(zip(successes, hops)):
            messages = [{"role": "user", "content": f"question {item}"}, {"role": "assistant", "content": "an answer"}]
            out.write(json.dumps({"data_source": "s", "ground_truth": str(item), "messages": messages, "success": success,
                                  "reward": float(success), "extra_info": {"hops": hop}, "stats": {}}) + "\n")
    return path


def test_posttrain_compare_prints_both_accuracies_and_the_paired_difference(tmp_path, capsys):
    hops = [1] * 20 + [2] * 20
    a = write_episodes(tmp_path / "a.jsonl", [True] * 20 + [False] * 20, hops)  # single-hop right, two-hop wrong
    b = write_episodes(tmp_path / "b.jsonl", [True] * 20 + [True] * 10 + [False] * 10, hops)
    assert compare_evaluations(a, b, by="hops") == 0
    out = capsys.readouterr().out
    low, high = wilson(20, 40)
    assert f"all (40 items)\n  A accuracy 0.500 [{low:.3f}, {high:.3f}]" in out
    assert "B - A +0.250, paired 95% interval [+0." in out
    assert "hops=1 (20 items)" in out and "hops=2 (20 items)" in out
    hops_one = out[out.index("hops=1"):out.index("hops=2")]
    assert "B - A +0.000, paired 95% interval [+0.000, +0.000]" in hops_one  # nothing changed there
    assert "the same transcript in A and B: 40 of 40 items" in out  # write_episodes gives every item one reply


def test_posttrain_compare_counts_the_items_whose_transcripts_are_the_same(tmp_path, capsys):
    a = write_episodes(tmp_path / "a.jsonl", [True] * 4, [1] * 4)
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    rows[1]["messages"][-1]["content"] = "another answer"
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert compare_evaluations(a, tmp_path / "b.jsonl") == 0
    assert "the same transcript in A and B: 3 of 4 items" in capsys.readouterr().out


def test_the_same_question_offered_other_tools_is_another_item(tmp_path, capsys):
    """Two files of one split index their rows from 0: a question at the same index asked with other functions (a BFCL
    dev row and its distractor row) is compared as two items, not averaged into one."""
    a = write_episodes(tmp_path / "a.jsonl", [True, False], [1, 1])
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    rows[1] |= {"ground_truth": rows[0]["ground_truth"], "messages": rows[0]["messages"]}
    rows[0]["extra_info"] |= {"index": 0, "tools": "[one function]"}
    rows[1]["extra_info"] |= {"index": 0, "tools": "[it and another]"}
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert compare_evaluations(tmp_path / "b.jsonl", tmp_path / "b.jsonl") == 0
    assert "all (2 items)\n  A accuracy 0.500" in capsys.readouterr().out


def test_posttrain_compare_refuses_files_without_common_items_or_rows(tmp_path, capsys):
    a = write_episodes(tmp_path / "a.jsonl", [True, False], [1, 1])
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"data_source": "t", "ground_truth": "9", "messages": [], "success": True}) + "\n")
    from posttrain.cli import main

    assert main(["compare", str(a), str(other)]) == 2  # as the command runs it: one line, exit 2
    assert "no item in common" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"no": "success"}\n')
    assert main(["compare", str(a), str(tmp_path / "bad.jsonl")]) == 2
    assert "line 1 is not an episode row" in capsys.readouterr().err
    (tmp_path / "text.jsonl").write_text("accuracy 0.5\n")
    assert main(["compare", str(a), str(tmp_path / "text.jsonl")]) == 2
    assert "text.jsonl line 1 is not JSON" in capsys.readouterr().err
    for field in ('"success": "false"', '"success": true, "messages": "hi"', '"success": true, "extra_info": "x"'):
        (tmp_path / "odd.jsonl").write_text("{" + field + "}\n")
        assert main(["compare", str(a), str(tmp_path / "odd.jsonl")]) == 2, field
        assert "odd.jsonl line 1 is not an episode row" in capsys.readouterr().err, field
    assert main(["compare", str(a), str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    assert main(["compare", str(a), str(tmp_path / "binary.jsonl")]) == 2
    assert "binary.jsonl is not UTF-8 text" in capsys.readouterr().err


def test_two_items_with_the_same_prompt_and_answer_stay_two_when_their_rows_differ(tmp_path, capsys):
    """Held-out doctor cases can share a self-report and a diagnosis; the dataset row keeps them apart."""
    def write(path, successes):
        with open(path, "w") as out:
            for index, success in enumerate(successes):
                messages = [{"role": "user", "content": "I've had a rash for four days."}, {"role": "assistant", "content": "x"}]
                out.write(json.dumps({"data_source": "d", "ground_truth": "shingles", "messages": messages, "success": success,
                                      "extra_info": {"index": index}}) + "\n")
        return path

    a, b = write(tmp_path / "a.jsonl", [True, True, False, False]), write(tmp_path / "b.jsonl", [True, False, True, True])
    assert compare_evaluations(a, b) == 0
    out = capsys.readouterr().out
    assert "all (4 items)" in out and "B - A +0.250" in out
