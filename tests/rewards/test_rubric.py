"""A rubric (``reward.rubric``, rewards/rubric.py): the weighted mean of named parts, each a data source's
rule or the user's function, through the one reward path (the scoring process, with deadlines); each
part's mean and its failures logged on their own; bad parts refused before any worker."""

import pytest

from posttrain.config import load_config
from posttrain.errors import InputError
from posttrain.metrics import values
from posttrain.protocol import Batch
from posttrain.rewards import build_reward_manager
from posttrain.rewards.rubric import build_rubric
from tests.rewards.helpers import CharTokenizer, response_batch, write_module

RULES = '''
def brief(solution_str, ground_truth):
    """1 for an answer under 12 characters."""
    return 1.0 if len(solution_str) < 12 else 0.0

def breaks_on_sevens(solution_str, ground_truth):
    if "7" in solution_str:
        raise RuntimeError("sevens")
    return {"score": 0.5, "acc": True}
'''


@pytest.fixture
def rules(tmp_path):
    return write_module(tmp_path / "my_rules.py", RULES)


def test_the_score_is_the_weighted_mean_of_the_parts_each_returned_beside_it(rules):
    rubric = build_rubric([{"name": "correct", "weight": 3, "rule": "arithmetic"}, {"name": "brief", "rule": f"{rules}:brief"}])
    right_and_brief = rubric(solution_str="#### 42", ground_truth="42", data_source="arithmetic")
    assert right_and_brief["score"] == 1.0 and right_and_brief["rubric/correct"] == 1.0 and right_and_brief["rubric/brief"] == 1.0
    wrong_and_brief = rubric(solution_str="#### 41", ground_truth="42")
    assert wrong_and_brief["score"] == pytest.approx(1 / 4) and wrong_and_brief["rubric/correct"] == 0.0  # (3×0 + 1×1) / 4
    right_and_long = rubric(solution_str="after some thought, #### 42", ground_truth="42")
    assert right_and_long["score"] == pytest.approx(3 / 4) and right_and_long["acc"] is True  # correct's acc decides
    assert rubric(solution_str="#### 41", ground_truth="42")["acc"] is False


def test_through_the_reward_path_each_part_is_logged_and_a_failing_part_costs_only_itself(rules):
    manager = build_reward_manager(CharTokenizer(), timeout_s=30, rubric=[
        {"name": "brief", "weight": 1.0, "rule": f"{rules}:brief"}, {"name": "flaky", "weight": 1.0, "rule": f"{rules}:breaks_on_sevens"}])
    try:
        batch = response_batch(["short", "a much longer answer", "has a 7"], [[1] * 20] * 3, ["x"] * 3, ["-"] * 3)
        result = manager(batch)
    finally:
        manager.close()
    # brief: 1, 0, 1; flaky: 0.5, 0.5, and 0 for the answer with a 7 (its error, counted; the answer is still scored)
    assert result.scores.tolist() == [0.75, 0.25, 0.5]
    logged = values(result.metrics)
    assert logged["reward/brief"] == pytest.approx(2 / 3) and logged["reward/flaky"] == pytest.approx(1 / 3)
    assert logged["reward/flaky/errors"] == 1 and logged["reward/brief/errors"] == 0 and logged["reward/errors"] == 0
    assert list(result.extra["rubric/flaky"]) == [0.5, 0.5, 0.0]
    # validation's episode files (and `posttrain eval --dump-episodes`) carry each part's score
    from posttrain import keys
    from posttrain.trainer.validation import episode_rows

    prompts = Batch.from_dict(non_tensors={keys.EXTRA_INFO: [{}] * 3, keys.TRANSCRIPT: [[{"role": "user", "content": "q"}]] * 3})
    rows = episode_rows(batch.union(prompts).union(result.to_batch()), CharTokenizer())
    assert [row["rubric"] for row in rows] == [{"brief": 1.0, "flaky": 0.5}, {"brief": 0.0, "flaky": 0.5}, {"brief": 1.0, "flaky": 0.0}]


@pytest.mark.parametrize("parts, message", [
    ([{"name": "a", "weight": 0, "rule": "arithmetic"}], "weight=0 must be a positive number"),
    ([{"name": "a", "rule": "arithmetic"}, {"name": "a", "rule": "gsm8k"}], "used twice"),
    ([{"name": "a", "rule": "no_such_source"}], "neither a data source"),
    ([{"name": "a", "rule": "missing.py:f"}], "does not exist"),
    ([{"name": "a", "judge": "Is it right?"}], "judge must be a mapping"),
    ([{"name": "a", "rule": "arithmetic", "judge": {"prompt": "Right? {answer}"}}], "one of the two"),
    ([{"name": "a", "judge": {"prompt": "Is {reply} right?"}}], "names {reply}"),
    ([{"name": "a", "judge": {"prompt": "Is {answer} right?", "parser": "vibes"}}], "parser='vibes' must be one of"),
    ([{"name": "a", "judge": {"prompt": "Grade {answer}", "parser": "choice"}}], "needs choices"),
    ([{"name": "a", "judge": {"prompt": "Grade {answer}", "parser": "score", "scale": 0}}], "scale=0 must be a positive"),
    ([{"name": "a", "judge": {"prompt": "Is {answer} right?", "rule": "no_such_source"}}], "neither a data source"),
    ([{"name": "a", "judge": {"prompt": "Is {answer:d} right?"}}], "cannot be filled with text"),
    ([{"name": "errors", "rule": "arithmetic"}], "the reward path's own reward/errors count"),
    ([{"rule": "arithmetic"}], "give each part a name"),
    ([], "empty"),
])
def test_bad_parts_are_refused_with_what_is_wrong(parts, message):
    with pytest.raises(InputError, match=message):
        build_rubric(parts)


def test_the_config_check_refuses_a_bad_rubric_and_one_beside_a_custom_function(rules):
    from posttrain.cli.preflight import rubric_problems

    bad = load_config([], ["reward.rubric=[{name: a, weight: -2, rule: arithmetic}]"])
    assert "weight=-2 must be a positive number" in rubric_problems(bad)[0].message
    beside = load_config([], ["reward.rubric=[{name: a, rule: arithmetic}]", f"custom_reward_function.path={rules}"])
    assert "scores every sample" in rubric_problems(beside)[0].message
    assert rubric_problems(load_config([], [f"reward.rubric=[{{name: a, rule: arithmetic}}, {{name: b, rule: '{rules}:brief'}}]"])) == []
