"""A score function that raises, hangs, or kills its process costs its samples, never the run."""

import time

import pytest

from posttrain.rewards import BatchRewardManager, FileScoreFunction, InlineScorer, ProcessScorer, build_reward_manager
from tests.rewards.helpers import CharTokenizer, response_batch, write_module

MISBEHAVING = """
    import os
    import time

    def compute_score(solution_str, ground_truth):
        if solution_str == "hang":
            while True:  # sleeps forever: only killing the process ends it
                time.sleep(1)
        if solution_str == "raise":
            raise RuntimeError("the grader broke")
        if solution_str == "exit":
            os._exit(3)
        return 1.0

    def batched(solution_strs, ground_truths):
        if "hang" in solution_strs:
            time.sleep(3600)
        if "short" in solution_strs:
            return [1.0]
        return [float(len(s)) for s in solution_strs]
"""


# If containment failed, these tests would hang: fail them instead.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def module(tmp_path):
    return write_module(tmp_path / "misbehaving.py", MISBEHAVING)


def test_raising_and_hanging_functions_are_contained(module, caplog):
    texts = ["ok", "hang", "raise", "ok", "hang", "ok"]
    batch = response_batch(texts, [[1] * 5] * 6, ["x"] * 6, ["-"] * 6)
    manager = build_reward_manager(CharTokenizer(), custom_path=str(module), timeout_s=0.5)
    try:
        started = time.monotonic()
        result = manager(batch)
        elapsed = time.monotonic() - started
        again = manager(response_batch(["ok"], [[1, 1]], ["x"], ["-"]))  # the scorer recovered
    finally:
        manager.close()
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert result.metrics["reward/errors"].value == 1.0 and result.metrics["reward/timeouts"].value == 2.0
    assert elapsed < 20  # two 0.5 s deadlines plus restarts; a hang would never return
    assert again.scores.tolist() == [1.0] and again.metrics["reward/timeouts"].value == 0.0
    assert "3 of 6 samples scored 0 (1 errors, 2 timeouts); first, sample 1: timed out" in caplog.text


def test_process_death_is_an_error_and_scoring_goes_on(module):
    scorer = ProcessScorer(timeout_s=10)
    function = FileScoreFunction(module)
    try:
        outcomes = scorer.run([function], [(0, {"solution_str": s, "ground_truth": "-"}) for s in ("ok", "exit", "ok")])
    finally:
        scorer.close()
    assert [o.value for o in outcomes] == [1.0, None, 1.0]
    assert "the scoring process died (exit code 3)" in outcomes[1].error


def test_load_failure_in_the_child_errors_every_call(module):
    function = FileScoreFunction(module)
    module.unlink()  # exists when the manager is made, gone when the child loads it
    with ProcessScorer(timeout_s=10) as scorer:
        outcomes = scorer.run([function], [(0, {"solution_str": "ok", "ground_truth": "-"})] * 2)
    assert all(not o.ok and "misbehaving.py does not exist" in o.error for o in outcomes)


def test_inline_scorer_contains_exceptions_and_system_exit():
    def raises(**_):
        raise SystemExit(2)

    (outcome,) = InlineScorer().run([raises], [(0, {})])
    assert outcome.error.startswith("SystemExit: 2") and not outcome.timed_out


def test_batched_manager_and_its_failures(module):
    function = FileScoreFunction(module, "batched", batched=True)
    manager = BatchRewardManager(CharTokenizer(), function, timeout_s=0.2)
    masks = [[1, 1, 1, 1, 1]] * 2
    try:
        good = manager(response_batch(["abc", "abcde"], masks, ["x"] * 2, ["-"] * 2))
        hung = manager(response_batch(["hang", "x"], masks, ["x"] * 2, ["-"] * 2))  # deadline 0.2 s x 2 samples
        short = manager(response_batch(["short", "x"], masks, ["x"] * 2, ["-"] * 2))
    finally:
        manager.close()
    assert good.scores.tolist() == [3.0, 5.0] and good.token_scores[1, 4] == 5.0
    assert hung.scores.tolist() == [0.0, 0.0] and hung.metrics["reward/timeouts"].value == 2.0
    assert short.scores.tolist() == [0.0, 0.0] and short.metrics["reward/errors"].value == 2.0


def test_batched_custom_function_from_config_fields(module):
    manager = build_reward_manager(CharTokenizer(), custom_path=str(module), custom_name="batched", batched=True, timeout_s=None)
    assert isinstance(manager, BatchRewardManager)
    assert manager(response_batch(["ab"], [[1, 1]], ["x"], ["-"])).scores.tolist() == [2.0]
    with pytest.raises(TypeError, match="solution_strs=..., ground_truths=..."):
        build_reward_manager(CharTokenizer(), custom_path=str(module), batched=True)  # compute_score is per-sample
    with pytest.raises(ValueError, match="set custom_reward_function.path"):
        build_reward_manager(CharTokenizer(), batched=True)


def test_the_budget_bounds_a_whole_batch_and_times_out_what_is_left(module):
    # Each call has 30 s, but the batch has 1 s: the hang is cut at the budget, the rest never start.
    texts = ["ok", "ok", "hang", "ok", "ok"]
    manager = build_reward_manager(CharTokenizer(), custom_path=str(module), timeout_s=30, budget_s=1.0)
    try:
        started = time.monotonic()
        result = manager(response_batch(texts, [[1] * 4] * 5, ["x"] * 5, ["-"] * 5))
        elapsed = time.monotonic() - started
        again = manager(response_batch(["ok"], [[1, 1]], ["x"], ["-"]))  # the next batch has a budget of its own
    finally:
        manager.close()
    assert result.scores.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert result.metrics["reward/timeouts"].value == 3.0 and result.metrics["reward/errors"].value == 0.0
    assert "sample 2: not scored within the budget of 1 s" in result.first_failure
    assert elapsed < 15  # the budget plus starting the child twice, not the 30 s deadline
    assert again.scores.tolist() == [1.0]


def test_the_inline_scorer_spends_its_budget_then_skips_the_rest():
    def slow(**_):
        time.sleep(0.3)
        return 1.0

    outcomes = InlineScorer().run([slow], [(0, {})] * 5, budget_s=0.5)
    # 0.3 s left 0.2 s; the second call cannot be stopped, and after it (0.6 s) nothing else starts
    assert [o.value for o in outcomes] == [1.0, 1.0, None, None, None]
    assert [o.timed_out for o in outcomes] == [False, False, True, True, True]


def test_the_batched_call_gets_the_smaller_of_its_deadline_and_the_budget(module):
    function = FileScoreFunction(module, "batched", batched=True)
    manager = BatchRewardManager(CharTokenizer(), function, timeout_s=30, budget_s=0.5)
    try:
        started = time.monotonic()
        hung = manager(response_batch(["hang", "x"], [[1] * 4] * 2, ["x"] * 2, ["-"] * 2))
        elapsed = time.monotonic() - started
    finally:
        manager.close()
    assert hung.metrics["reward/timeouts"].value == 2.0 and "budget of 0.5 s" in hung.first_failure
    assert elapsed < 15  # not 30 s x 2 samples
