"""data_source ``reasoning_gym``: posttrain's scorer gives reasoning-gym's own score, the one its
``score_answer`` gives when called directly, on right, wrong and partial answers."""

import json
import pickle
import subprocess
import sys

import pytest
from tests.optional import require

require("reasoning_gym", 'reasoning-gym is installed by scripts/setup.sh (pip install -e ".[envs]")')

import reasoning_gym  # noqa: E402
from reasoning_gym.utils import extract_answer  # noqa: E402

from posttrain.data.preparers.reasoning_gym import prepare_reasoning_gym  # noqa: E402
from posttrain.errors import InputError, MissingLibraryError  # noqa: E402
from posttrain.rewards import DEFAULT_SCORE_FUNCTIONS, InlineScorer, ProcessScorer, score_function_for  # noqa: E402
from posttrain.rewards import reasoning_gym as rg  # noqa: E402

CONFIGS = {"chain_sum": {"min_terms": 2, "max_terms": 3, "max_digits": 2}, "spell_backward": {"min_word_len": 4, "max_word_len": 6},
           "leg_counting": {"min_animals": 1, "max_animals": 2}}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Held-out rows as `posttrain prepare reasoning-gym` writes them, 4 per task."""
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("rg")
    prepare_reasoning_gym(out, tasks=",".join(CONFIGS), configs=json.dumps(CONFIGS), size=8, test_size=4)
    return pq.read_table(out / "test.parquet").to_pylist()


def _posttrain_score(response: str, row: dict) -> dict:
    score = score_function_for("reasoning_gym")
    return score(solution_str=response, ground_truth=row["reward_model"]["ground_truth"], data_source="reasoning_gym", extra_info=row["extra_info"])


def _library(row: dict) -> tuple:
    """The row's dataset and entry, made with the library alone, and its score of a response."""
    ref = json.loads(row["reward_model"]["ground_truth"])
    data = reasoning_gym.create_dataset(ref["task"], seed=ref["seed"], size=ref["size"], **ref["config"])
    entry = data[ref["index"]]
    return entry, lambda response: data.score_answer(extract_answer(response), entry)


def test_right_answers_score_as_the_library_scores_them(rows):
    for row in rows:
        entry, library_score = _library(row)
        response = f"I think it through.\n<answer>{entry['answer']}</answer>"
        result = _posttrain_score(response, row)
        assert result == {"score": library_score(response), "acc": 1.0, "format": 1.0} and result["score"] == 1.0, row["extra_info"]


def test_wrong_answers_score_as_the_library_scores_them(rows):
    for row in rows:
        entry, library_score = _library(row)
        response = "<answer>?</answer>"
        assert _posttrain_score(response, row) == {"score": library_score(response), "acc": 0.0, "format": 1.0} == {"score": 0.0, "acc": 0.0, "format": 1.0}
        untagged = f"The answer is {entry['answer']}."  # right, but not where the library reads it
        assert _posttrain_score(untagged, row) == {"score": library_score(untagged), "acc": 0.0, "format": 0.0}


def test_partial_credit_is_kept_as_the_library_gives_it(rows):
    for row in [r for r in rows if r["extra_info"]["task"] == "spell_backward"]:
        entry, library_score = _library(row)
        answer = entry["answer"][:-1] + ("z" if entry["answer"][-1].lower() != "z" else "y")
        response = f"<answer>{answer}</answer>"  # every letter in place but the last: (n - 1) / n
        assert _posttrain_score(response, row)["score"] == library_score(response) == pytest.approx((len(answer) - 1) / len(answer))
    for row in [r for r in rows if r["extra_info"]["task"] == "chain_sum"]:
        entry, library_score = _library(row)
        response = f"<answer>it is {entry['answer']}</answer>"  # the right number among other text: len(answer) / len(text)
        expected = len(entry["answer"]) / len(f"it is {entry['answer']}")
        assert _posttrain_score(response, row)["score"] == library_score(response) == pytest.approx(expected)
        assert _posttrain_score(response, row)["acc"] == 0.0


def test_the_scoring_process_gives_the_same_scores(rows):
    table = [DEFAULT_SCORE_FUNCTIONS["reasoning_gym"]]
    calls = [(0, {"solution_str": f"<answer>{_library(row)[0]['answer']}</answer>", "ground_truth": row["reward_model"]["ground_truth"]})
             for row in rows[:2]]
    with ProcessScorer(timeout_s=60) as scorer:
        in_child = scorer.run(table, calls)
    assert [o.value for o in in_child] == [o.value for o in InlineScorer().run(table, calls)] == [{"score": 1.0, "acc": 1.0, "format": 1.0}] * 2


def test_unpickling_the_score_function_imports_the_library():
    blob = pickle.dumps(DEFAULT_SCORE_FUNCTIONS["reasoning_gym"])
    code = ("import pickle, sys, posttrain.rewards; before = 'reasoning_gym' in sys.modules; "
            "f = pickle.loads(sys.stdin.buffer.read()); print(before, 'reasoning_gym' in sys.modules, callable(f))")
    shown = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True).stdout.decode().split()
    assert shown == ["False", "True", "True"]


def test_a_changed_generator_is_refused_not_scored(rows):
    reference = json.loads(rows[0]["reward_model"]["ground_truth"]) | {"question_sha256": "0" * 64}
    with pytest.raises(InputError, match="regenerates another question"):
        rg.compute_score("<answer>1</answer>", json.dumps(reference))
    with pytest.raises(InputError, match="not a reasoning-gym item reference"):
        rg.compute_score("<answer>1</answer>", "42")


def test_without_the_library_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(MissingLibraryError, match=r"pip install .*reasoning-gym==0\.1\.25"):
        rg.library()
