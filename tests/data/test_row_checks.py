"""Rows are checked when a run loads them, before any worker starts: unknown chat roles (any run),
and rows the reward's table cannot score (unknown data_source, missing ground truth). Every problem
is reported at once, each naming file, row and field, each fix said once."""

import re

import pytest

from posttrain.cli import main
from posttrain.data import DataFormatError, RLDataset, prepare, read_rows
from posttrain.models import cached_tiny_model
from posttrain.rewards import build_reward_manager
from posttrain.rollout.single_turn import SingleTurnRollout
from tests.data.helpers import verl_row, write_parquet
from tests.rewards.helpers import CharTokenizer, response_batch


def _with_role(row: dict, index: int, role: str) -> dict:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    messages[index]["role"] = role
    return row | {"prompt": messages}


def test_unknown_chat_roles_in_several_files_are_refused_together_naming_file_row_and_field(tmp_path, tokenizer):
    first = write_parquet(tmp_path / "a.parquet", [verl_row(0, "ok"), _with_role(verl_row(1, ""), 1, "human"), verl_row(2, "ok")])
    second = write_parquet(tmp_path / "b.parquet", [_with_role(verl_row(0, ""), 0, "bot")])
    with pytest.raises(DataFormatError) as refused:
        RLDataset([first, second], tokenizer)
    lines = str(refused.value).splitlines()
    assert lines[0] == "2 problem(s) in the data:"
    assert lines[1] == f"  {first} row 1, prompt[1].role: 'human' is not a chat role"
    assert lines[2] == f"  {second} row 0, prompt[0].role: 'bot' is not a chat role"
    assert lines[3].startswith("Fix: give each message one of the roles system, user, assistant, tool")
    assert len(lines) == 4  # the fix once for both rows


def test_every_chat_role_is_accepted(tmp_path):
    messages = [{"role": role, "content": "x"} for role in ("system", "user", "assistant", "tool", "user")]
    path = write_parquet(tmp_path / "a.parquet", [verl_row(0, "") | {"prompt": messages}])
    assert [m["role"] for m in read_rows(path)[0].messages] == ["system", "user", "assistant", "tool", "user"]


def test_more_than_ten_problems_are_cut_with_how_many_more(tmp_path):
    rows = [_with_role(verl_row(i, ""), 1, "human") for i in range(13)] + [verl_row(13, "") | {"reward_model": None}]
    path = write_parquet(tmp_path / "a.parquet", rows)
    with pytest.raises(DataFormatError) as refused:
        read_rows(path)
    message = str(refused.value)
    assert message.startswith("14 problem(s) in the data:")
    assert re.findall(r"row (\d+), ", message) == [str(i) for i in range(10)]
    assert "  ... and 4 more" in message
    assert "row 13, reward_model" not in message and message.count("Fix: ") == 2  # the unlisted row's fix is still said


@pytest.fixture
def unscorable(tmp_path, tokenizer):
    """(train, validation) datasets: train row 1 has an unknown data_source; validation rows 0 and 2 no ground truth."""
    train = write_parquet(tmp_path / "train.parquet", [
        verl_row(0, "1+1?", data_source="arithmetic", ground_truth="2"),
        verl_row(1, "2+2?", data_source="my/source", ground_truth="4"),
    ])
    val = write_parquet(tmp_path / "test.parquet", [
        verl_row(0, "3+3?", data_source="arithmetic", ground_truth=" "),
        verl_row(1, "4+4?", data_source="gsm8k", ground_truth="8"),
        verl_row(2, "5+5?", data_source="gsm8k", ground_truth=None),
    ])
    return RLDataset(train, tokenizer), RLDataset(val, tokenizer)


def test_rows_the_built_in_scorers_cannot_score_are_refused_naming_file_row_and_field(unscorable):
    train, val = unscorable
    rollout = SingleTurnRollout(build_reward_manager(None, timeout_s=None), 8, 0)
    with pytest.raises(DataFormatError) as refused:
        rollout.check_data(training=train, validation=val)
    lines = str(refused.value).splitlines()
    assert lines[:4] == [
        "3 problem(s) in the data:",
        f"  {train.samples[1].file} row 1, data_source: 'my/source' has no score function",
        f"  {val.samples[0].file} row 0, reward_model.ground_truth: ' ' is no answer to compare with",
        f"  {val.samples[0].file} row 2, reward_model.ground_truth: None is no answer to compare with",
    ]
    assert "'arithmetic'" in lines[4] and "'openai/gsm8k'" in lines[4] and "custom_reward_function.path" in lines[4]
    assert "fill it in" in lines[5] and len(lines) == 6


def test_a_custom_reward_function_takes_any_row(unscorable, tmp_path):
    # the function echoes what it was given: the data source and the ground truth, as the row holds them
    (tmp_path / "reward.py").write_text(
        "def compute_score(solution_str, ground_truth, data_source):\n"
        "    return {'score': float(len(solution_str)), 'seen': f'{data_source}|{ground_truth!r}'}\n"
    )
    manager = build_reward_manager(CharTokenizer(), custom_path=str(tmp_path / "reward.py"), timeout_s=None)
    train, val = unscorable
    assert SingleTurnRollout(manager, 8, 0).check_data(training=train, validation=val) is None  # nothing refused
    # the three rows the built-in table refuses are scored by the user's function, which decides
    refused = [train.samples[1], val.samples[0], val.samples[2]]
    result = manager(response_batch(["four", "four", "four"], [[1] * 4] * 3, [s.data_source for s in refused],
                                    [s.ground_truth for s in refused]))
    assert result.scores.tolist() == [4.0, 4.0, 4.0] and result.metrics["reward/errors"].value == 0
    assert list(result.extra["seen"]) == ["my/source|'4'", "arithmetic|' '", "gsm8k|None"]


@pytest.mark.parametrize("name", ["arithmetic", "synthetic-search", "synthetic-doctor"])
def test_the_preparers_rows_pass_the_load_checks(tmp_path, name):
    rows = [row for path in prepare(name, tmp_path, train_size=4, val_size=2) for row in read_rows(path)]
    assert len(rows) == 6


def test_posttrain_train_refuses_unscorable_rows_before_starting_ray(tmp_path, capsys, monkeypatch):
    import posttrain.cli.train as run

    started = []
    monkeypatch.setattr(run, "start_ray", lambda *args: started.append(args))  # other tests may have Ray up in this process
    rows = [verl_row(i, f"{i}+1?", data_source="arithmetic", ground_truth=str(i + 1)) for i in range(4)]
    rows[3] = rows[3] | {"data_source": "mine"}
    path = write_parquet(tmp_path / "train.parquet", rows)
    code = main([
        "train", f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", f"data.train_files=[{path}]",
        f"data.val_files=[{path}]", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ])
    error = capsys.readouterr().err
    assert code == 2, error
    assert f"1 problem(s) in the data:\n  {path} row 3, data_source: 'mine' has no score function" in error  # read twice, said once
    assert "Traceback" not in error
    assert not started
