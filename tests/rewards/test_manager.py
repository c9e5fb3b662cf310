"""Reward managers: decoding, score placement on the last response token, routing by data_source, custom functions."""

import math

import numpy as np
import pytest
import torch

from posttrain import keys
from posttrain.metrics import values
from posttrain.protocol import Batch
from posttrain.rewards import (
    DEFAULT_SCORE_FUNCTIONS,
    CustomRewardError,
    RewardManager,
    UnknownDataSourceError,
    build_reward_manager,
)
from tests.rewards.helpers import CharTokenizer, ids, response_batch, write_module


def _length_score(solution_str, ground_truth):
    return float(len(solution_str))


def test_scores_sit_on_the_last_valid_response_token():
    masks = [
        [1, 1, 1, 0, 0, 0],  # right-padded: last valid at 2
        [1, 1, 1, 1, 1, 1],  # full width: 5
        [1, 1, 0, 0, 1, 0],  # observation tokens (mask 0) inside a multi-turn response: 4
        [0, 0, 0, 0, 0, 0],  # empty: the score goes to position 0
    ]
    batch = response_batch(["abc", "abcdef", "ab..e", ""], masks, ["x"] * 4, ["-"] * 4)
    manager = RewardManager(CharTokenizer(), score_function=_length_score, timeout_s=None)
    result = manager(batch)
    # Decoded up to the last valid token: the observation "..", inside, is kept; the END fill is not.
    assert result.scores.tolist() == [3.0, 6.0, 5.0, 0.0]
    expected = torch.zeros(4, 6)
    expected[0, 2], expected[1, 5], expected[2, 4] = 3.0, 6.0, 5.0
    assert torch.equal(result.token_scores, expected) and result.token_scores.dtype == torch.float32
    assert values(result.metrics) == {"reward/samples": 4.0, "reward/errors": 0.0, "reward/timeouts": 0.0, "reward/empty_responses": 1.0}


def test_attention_mask_tail_is_used_without_a_response_mask():
    prompt_mask = [[0, 1], [1, 1]]
    response_mask = [[1, 1, 0], [1, 0, 0]]
    batch = Batch.from_dict(
        {
            keys.RESPONSE_IDS: torch.tensor([ids("ab", 3), ids("a", 3)]),
            keys.ATTENTION_MASK: torch.tensor([p + r for p, r in zip(prompt_mask, response_mask)]),
        },
        {keys.DATA_SOURCE: ["x", "x"], keys.GROUND_TRUTH: ["-", "-"]},
    )
    result = RewardManager(CharTokenizer(), score_function=_length_score, timeout_s=None)(batch)
    assert result.token_scores.tolist() == [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]


def test_missing_mask_or_column_is_named():
    batch = Batch.from_dict({keys.RESPONSE_IDS: torch.tensor([ids("a", 2)])}, {keys.DATA_SOURCE: ["x"], keys.GROUND_TRUTH: ["1"]})
    manager = RewardManager(CharTokenizer(), score_function=_length_score, timeout_s=None)
    with pytest.raises(KeyError, match="'response_mask' \\(B, T\\) or 'attention_mask'"):
        manager(batch)
    no_truth = response_batch(["a"], [[1]], ["x"], ["1"]).select([keys.RESPONSE_IDS, keys.RESPONSE_MASK, keys.DATA_SOURCE])
    with pytest.raises(KeyError, match="non-tensor column 'ground_truth'"):
        manager(no_truth)


def test_functions_are_picked_by_data_source_and_extras_returned():
    texts = ["so #### 72", "#### 71", "7 + 9 = 16", "I don't know", "$\\boxed{\\frac{2}{4}}$"]
    sources = ["openai/gsm8k", "gsm8k", "arithmetic", "arithmetic", "HuggingFaceH4/MATH-500"]
    batch = response_batch(texts, [[1] * 24] * 5, sources, ["72", "72", "16", "16", "\\frac{1}{2}"])
    # In a child process with a deadline: the built-in functions must travel there.
    manager = RewardManager(CharTokenizer(), timeout_s=30)
    try:
        result = manager(batch)
    finally:
        manager.close()
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert result.extra["acc"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert result.extra["format"][:4].tolist() == [1.0, 1.0, 1.0, 0.0] and math.isnan(result.extra["format"][4])
    assert result.metrics["reward/errors"].value == 0.0


def test_unknown_data_source_lists_known_sources_and_the_fix():
    batch = response_batch(["1"], [[1]], ["my/dataset"], ["1"])
    with pytest.raises(UnknownDataSourceError) as error:
        RewardManager(CharTokenizer(), timeout_s=None)(batch)
    message = str(error.value)
    assert "'my/dataset'" in message and "'openai/gsm8k'" in message and "'arithmetic'" in message
    assert "custom_reward_function.path" in message and "score_functions=" in message


def test_a_table_can_add_a_data_source():
    table = {**DEFAULT_SCORE_FUNCTIONS, "mine": _length_score}
    batch = response_batch(["abcd", "#### 5"], [[1] * 6] * 2, ["mine", "gsm8k"], ["-", "5"])
    result = RewardManager(CharTokenizer(), score_functions=table, timeout_s=None)(batch)
    assert result.scores.tolist() == [4.0, 1.0]
    assert math.isnan(result.extra["acc"][0]) and result.extra["acc"][1] == 1.0  # a float has no acc


CUSTOM = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        # verl's signature: data_source first, extra_info optional
        hit = solution_str.strip() == ground_truth
        return {"score": float(hit) + bonus, "source": data_source, "row": extra_info["index"]}

    def plain(solution_str, ground_truth):
        return 0.5
"""


def test_custom_function_from_a_file_with_kwargs(tmp_path):
    path = write_module(tmp_path / "my_reward.py", CUSTOM)
    batch = response_batch(["42", "41"], [[1, 1]] * 2, ["a", "b"], ["42", "42"], [{"index": 7}, {"index": 8}])
    manager = build_reward_manager(CharTokenizer(), custom_path=str(path), reward_kwargs={"bonus": 0.25}, timeout_s=30)
    try:
        result = manager(batch)
    finally:
        manager.close()
    assert result.scores.tolist() == [1.25, 0.25]
    assert result.extra["source"].tolist() == ["a", "b"] and result.extra["row"].tolist() == [7.0, 8.0]
    plain = build_reward_manager(CharTokenizer(), custom_path=str(path), custom_name="plain", timeout_s=None)
    assert plain(batch).scores.tolist() == [0.5, 0.5]  # no data_source/extra_info passed to a function without them


def test_custom_function_errors_say_what_to_fix(tmp_path):
    path = write_module(tmp_path / "my_reward.py", CUSTOM)
    with pytest.raises(FileNotFoundError, match="no_such.py does not exist; set custom_reward_function.path"):
        build_reward_manager(CharTokenizer(), custom_path=str(tmp_path / "no_such.py"))
    with pytest.raises(CustomRewardError, match="defines no function 'score'.*'compute_score', 'plain'"):
        build_reward_manager(CharTokenizer(), custom_path=str(path), custom_name="score")
    with pytest.raises(TypeError, match="reward_kwargs \\['bonsu'\\] are not parameters"):
        build_reward_manager(CharTokenizer(), custom_path=str(path), reward_kwargs={"bonsu": 1})
    broken = write_module(tmp_path / "broken.py", "import no_such_module\n")
    with pytest.raises(CustomRewardError, match="running custom reward file .*broken.py failed: ModuleNotFoundError"):
        build_reward_manager(CharTokenizer(), custom_path=str(broken))
    wrong_args = write_module(tmp_path / "wrong.py", "def compute_score(text, answer):\n    return 1.0\n")
    with pytest.raises(TypeError, match="cannot be called as .*solution_str=..., ground_truth=..."):
        build_reward_manager(CharTokenizer(), custom_path=str(wrong_args))


def test_unpicklable_function_with_a_deadline_is_refused():
    with pytest.raises(TypeError, match="cannot be sent to the scoring process.*timeout_s=None"):
        RewardManager(CharTokenizer(), score_function=lambda solution_str, ground_truth: 1.0, timeout_s=5)


def test_bad_return_values_score_zero_and_count_as_errors(tmp_path):
    source = """
        def compute_score(solution_str, ground_truth):
            return {"n": 1.0, "s": "yes", "d": {"score": 2.0}, "nan": float("nan"), "t": True}[solution_str]
    """
    path = write_module(tmp_path / "odd.py", source)
    batch = response_batch(["n", "s", "d", "nan", "t"], [[1, 1, 1]] * 5, ["x"] * 5, ["-"] * 5)
    result = build_reward_manager(CharTokenizer(), custom_path=str(path), timeout_s=None)(batch)
    assert result.scores.tolist() == [1.0, 0.0, 2.0, 0.0, 0.0]  # a bool is not a score
    assert result.metrics["reward/errors"].value == 3.0


def test_result_as_batch():
    batch = response_batch(["#### 5"], [[1] * 6], ["gsm8k"], ["5"])
    out = RewardManager(CharTokenizer(), timeout_s=None)(batch).to_batch()
    assert out[keys.TOKEN_SCORES].tolist() == [[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]
    assert out["reward_extra/acc"].tolist() == [1.0] and out.metrics["reward/errors"].value == 0.0
    assert isinstance(out["reward_extra/acc"], np.ndarray)


def test_real_tokenizer_skips_special_tokens(tokenizer):
    text_ids = tokenizer("#### 72", add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    row = text_ids + [end, end, end]  # eos, then padding with the pad token (= eos here)
    mask = [1] * (len(text_ids) + 1) + [0, 0]  # the eos is a real response token
    batch = Batch.from_dict(
        {keys.RESPONSE_IDS: torch.tensor([row]), keys.RESPONSE_MASK: torch.tensor([mask])},
        {keys.DATA_SOURCE: ["openai/gsm8k"], keys.GROUND_TRUTH: ["72"]},
    )
    result = RewardManager(tokenizer, timeout_s=None)(batch)
    assert result.scores.tolist() == [1.0]
    assert result.token_scores[0].nonzero().flatten().tolist() == [len(text_ids)]  # on the eos token


class _Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")


# What a score function returns → its score (0.0: unusable, counted in reward/errors).
RETURN_VALUES = [
    pytest.param(2, 2.0, False, id="int"),
    pytest.param(0.5, 0.5, False, id="float"),
    pytest.param(np.float32(0.25), 0.25, False, id="numpy-float"),
    pytest.param(np.int64(3), 3.0, False, id="numpy-int"),
    pytest.param({"score": 1, "acc": True}, 1.0, False, id="dict"),
    pytest.param(True, 0.0, True, id="bool"),
    pytest.param(np.bool_(True), 0.0, True, id="numpy-bool"),
    pytest.param("1.0", 0.0, True, id="str"),
    pytest.param(None, 0.0, True, id="None"),
    pytest.param(1j, 0.0, True, id="complex"),
    pytest.param(10**400, 0.0, True, id="10**400"),  # an int beyond a float's range
    pytest.param(10**5000, 0.0, True, id="10**5000"),  # beyond what Python will even print
    pytest.param(float("nan"), 0.0, True, id="nan"),
    pytest.param(float("-inf"), 0.0, True, id="-inf"),
    pytest.param(np.float64("inf"), 0.0, True, id="numpy-inf"),
    pytest.param([1.0], 0.0, True, id="list"),
    pytest.param(_Unprintable(), 0.0, True, id="broken-repr"),
    pytest.param({"score": "1.0"}, 0.0, True, id="dict-str"),
    pytest.param({"score": True}, 0.0, True, id="dict-bool"),
    pytest.param({"score": 10**400}, 0.0, True, id="dict-10**400"),
    pytest.param({"score": None}, 0.0, True, id="dict-None"),
    pytest.param({"acc": 1.0}, 0.0, True, id="dict-without-score"),
]


@pytest.mark.parametrize(("value", "score", "is_error"), RETURN_VALUES)
def test_any_return_value_is_a_finite_score_or_a_counted_zero(value, score, is_error):
    manager = RewardManager(CharTokenizer(), score_function=lambda solution_str, ground_truth: value, timeout_s=None)
    result = manager(response_batch(["a", "b"], [[1, 1]] * 2, ["x"] * 2, ["-"] * 2))  # never raises
    assert result.scores.tolist() == [score, score]
    assert result.metrics["reward/errors"].value == (2.0 if is_error else 0.0) and result.metrics["reward/samples"].value == 2.0
    assert (result.first_failure is not None) == is_error
    if is_error:
        assert result.first_failure.startswith("sample 0: the score function ")


def test_an_extra_too_big_for_a_float_is_kept_as_an_object():
    values = iter([{"score": 1.0, "big": 10**400}, {"score": 0.5, "big": 2}])
    manager = RewardManager(CharTokenizer(), score_function=lambda solution_str, ground_truth: next(values), timeout_s=None)
    result = manager(response_batch(["a", "b"], [[1, 1]] * 2, ["x"] * 2, ["-"] * 2))
    assert result.scores.tolist() == [1.0, 0.5] and result.metrics["reward/errors"].value == 0.0
    assert result.extra["big"].dtype == object and result.extra["big"].tolist() == [10**400, 2]


def test_a_huge_score_from_the_scoring_process_is_an_error_too(tmp_path):
    path = write_module(tmp_path / "huge.py", """
        def compute_score(solution_str, ground_truth):
            return 10**400 if solution_str == "huge" else 1.0
    """)
    manager = build_reward_manager(CharTokenizer(), custom_path=str(path), timeout_s=10)
    try:
        result = manager(response_batch(["huge", "ok"], [[1, 1, 1, 1]] * 2, ["x"] * 2, ["-"] * 2))
    finally:
        manager.close()
    assert result.scores.tolist() == [0.0, 1.0] and result.metrics["reward/errors"].value == 1.0
    assert "too large for a float" in result.first_failure


class _Judge:
    """A score function that asks a service from the controller's process: it holds what a child process
    could not be sent (a lock, as a client to a Ray worker or a URL would), and one answer never comes."""

    in_process = True

    def __init__(self):
        import threading

        self.lock, self.asked_from, self.release = threading.Lock(), set(), threading.Event()

    def __call__(self, solution_str, ground_truth):
        import os

        with self.lock:
            self.asked_from.add(os.getpid())
        if solution_str == "hang":
            self.release.wait(30)  # a service that stops answering
        return float(solution_str == ground_truth)


def test_a_score_function_that_asks_a_service_runs_in_this_process_side_by_side_with_a_deadline(tokenizer):
    import os
    import time

    from posttrain.rewards.manager import Answer

    judge = _Judge()
    manager = RewardManager(tokenizer, score_functions={"judged": judge, "gsm8k": DEFAULT_SCORE_FUNCTIONS["gsm8k"]}, timeout_s=1.0)
    answers = [Answer(text, "42", "judged") for text in ("42", "hang", "41", "42")] + [Answer("#### 42", "42", "gsm8k")]
    try:
        start = time.monotonic()
        scored = manager.score(answers)
        took = time.monotonic() - start
    finally:
        judge.release.set()
        manager.close()
    assert scored.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]  # the rule's answer still scored in the child
    assert scored.metrics["reward/timeouts"].value == 1 and scored.metrics["reward/errors"].value == 0
    assert "deadline of 1 s" in scored.first_failure
    assert judge.asked_from == {os.getpid()} and took < 10  # here, side by side: one wait of the deadline, not one per call


def test_a_service_call_that_hangs_costs_only_itself_not_the_calls_after_it():
    import threading
    import time

    from posttrain.deadlines import ServiceScorer

    release = threading.Event()

    def slow(seconds):
        if seconds > 1:
            release.wait(10)
        else:
            time.sleep(seconds)
        return seconds

    try:
        outcomes = ServiceScorer(timeout_s=0.5, max_concurrent=2).run([slow], [(0, {"seconds": s}) for s in (3, 0, 0.3, 0.3)])
    finally:
        release.set()
    assert [o.timed_out for o in outcomes] == [True, False, False, False] and [o.value for o in outcomes[1:]] == [0, 0.3, 0.3]


def test_a_custom_function_from_a_file_that_asks_a_service_is_called_in_this_process(tmp_path, tokenizer):
    import os

    from posttrain.rewards.manager import Answer
    from posttrain.deadlines import runs_in_process

    path = write_module(tmp_path / "judge.py", """
        import os, threading
        LOCK = threading.Lock()  # what a client holds: it could not be sent to a child process

        def judge(solution_str, ground_truth):
            return float(os.getpid())
        judge.in_process = True
    """)
    manager = build_reward_manager(tokenizer, custom_path=str(path), custom_name="judge", timeout_s=5.0)
    try:
        assert runs_in_process(manager.score_function)
        assert manager.score([Answer("x", "y", "any")]).scores.tolist() == [float(os.getpid())]
    finally:
        manager.close()
