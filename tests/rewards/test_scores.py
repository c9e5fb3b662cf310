"""Score functions on hand-written responses: correct, wrong, malformed, formatted-but-wrong."""

from decimal import Decimal

import pytest

from posttrain.rewards import arithmetic, gsm8k, math_answer
from posttrain.rewards.numeric import extract_answer, normalize_number


@pytest.mark.parametrize(
    ("text", "value"),
    [("72", 72), ("1,000", 1000), ("$18", 18), ("-$3.50", Decimal("-3.5")), ("$-3", -3), ("10.0", 10), ("7.", 7)],
)
def test_normalize_number(text, value):
    assert normalize_number(text) == Decimal(value)


@pytest.mark.parametrize("text", ["abc", "", "1.2.3", "--5", "nan", "inf"])
def test_normalize_number_rejects_non_numbers(text):
    assert normalize_number(text) is None


def test_extract_answer_strict_takes_last_marker_and_flexible_last_number():
    text = "First #### 5, then 6 apples. #### $1,200.50 is the total, 7"
    assert extract_answer(text, "strict") == "$1,200.50"
    assert extract_answer(text, "flexible") == "7"
    assert extract_answer("no numbers", "flexible") is None
    assert extract_answer("#### about twelve", "strict") is None
    with pytest.raises(ValueError, match="method='loose'"):
        extract_answer("1", "loose")


def test_gsm8k_strict():
    correct = "48 / 2 = 24 in May, 48 + 24 = 72.\n#### 72"
    assert gsm8k.compute_score(correct, "72") == {"score": 1.0, "acc": 1.0, "format": 1.0, "pred": "72"}
    assert gsm8k.compute_score("so #### $1,000.00", "1000")["acc"] == 1.0
    assert gsm8k.compute_score("#### 71", "72") == {"score": 0.0, "acc": 0.0, "format": 1.0, "pred": "71"}
    assert gsm8k.compute_score("The answer is 72.", "72") == {"score": 0.0, "acc": 0.0, "format": 0.0, "pred": None}


def test_gsm8k_format_score_only_for_well_formed_wrong_answers():
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1)["score"] == pytest.approx(0.1)
    assert gsm8k.compute_score("72 I think", "72", format_score=0.1)["score"] == 0.0  # malformed
    assert gsm8k.compute_score("#### 72", "72", format_score=0.1)["score"] == 1.0


def test_gsm8k_flexible():
    assert gsm8k.compute_score("She sold 48 + 24 = 72 clips.", "72", method="flexible")["score"] == 1.0
    assert gsm8k.compute_score("72 clips, or 73", "72", method="flexible", format_score=0.2)["score"] == pytest.approx(0.2)
    assert gsm8k.compute_score("no idea", "72", method="flexible") == {"score": 0.0, "acc": 0.0, "format": 0.0, "pred": None}


def test_arithmetic_default_reads_last_number():
    assert arithmetic.compute_score("7 + 9 = 16", "16")["score"] == 1.0
    assert arithmetic.compute_score("7 + 9 = 16\n#### 16", "16")["score"] == 1.0
    assert arithmetic.compute_score("-3", "-3")["score"] == 1.0
    assert arithmetic.compute_score("7 + 9 = 15", "16") == {"score": 0.0, "acc": 0.0, "format": 1.0, "pred": "15"}
    assert arithmetic.compute_score("#### 16.0", "16")["pred"] == "16"  # normalised, so votes for 16 and 16.0 agree
    assert arithmetic.compute_score("sixteen", "16")["format"] == 0.0


def test_arithmetic_strict_and_integer_exactness():
    assert arithmetic.compute_score("7 + 9 = 16", "16", method="strict")["score"] == 0.0
    assert arithmetic.compute_score("#### 16", "16", method="strict")["score"] == 1.0
    assert arithmetic.compute_score("#### 15", "16", method="strict", format_score=0.1)["score"] == pytest.approx(0.1)
    assert arithmetic.compute_score("#### 16.0", 16, method="strict")["acc"] == 1.0
    assert arithmetic.compute_score("#### 16.5", "16", method="strict")["acc"] == 0.0


def test_math_verify_scores_equivalent_latex():
    assert math_answer.compute_score("So the answer is $\\boxed{\\frac{2}{4}}$.", "\\frac{1}{2}") == {"score": 1.0, "acc": 1.0}
    assert math_answer.compute_score("\\boxed{1+x^2}", "x^2+1")["score"] == 1.0
    assert math_answer.compute_score("The answer is $\\sqrt{2}$", "\\sqrt{2}")["score"] == 1.0
    assert math_answer.compute_score("\\boxed{41}", "42")["score"] == 0.0


@pytest.mark.parametrize("response", ["", "no math here", "\\boxed{", "$\\frac{1}{$", "\\boxed{\\undefinedmacro{{}"])
def test_math_verify_malformed_responses_score_zero(response):
    assert math_answer.compute_score(response, "3") == {"score": 0.0, "acc": 0.0}


def test_math_verify_unparsable_ground_truth_scores_zero():
    assert math_answer.compute_score("\\boxed{3}", "\\frac{")["score"] == 0.0
