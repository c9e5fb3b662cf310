"""RLDataset: verl-format Parquet, mixing files, the chat template, truncation, filtering, format errors."""

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posttrain.data import DataFormatError, PromptTooLongError, RLDataset, tokenize_prompts
from tests.data.helpers import verl_row, write_parquet


def _template_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_reads_rows_and_applies_chat_template(tmp_path, tokenizer):
    path = write_parquet(tmp_path / "a.parquet", [verl_row(0, "What is 2+2?", data_source="gsm8k", ground_truth="4")])
    dataset = RLDataset(path, tokenizer, max_prompt_length=512)
    sample = dataset[0]
    assert sample.data_source == "gsm8k" and sample.ground_truth == "4"
    assert sample.extra_info == {"split": "train", "index": 0}
    assert sample.messages == [{"role": "user", "content": "What is 2+2?"}]
    text = tokenizer.decode(sample.prompt_ids)
    # ChatML with the generation prompt, and the BOS-like <|im_start|> not doubled.
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # system, user, assistant
    assert sample.prompt_ids == _template_ids(tokenizer, "What is 2+2?")


def test_mixes_files_in_order_even_with_different_extra_info(tmp_path, tokenizer):
    first = write_parquet(tmp_path / "a.parquet", [verl_row(i, f"a{i}", data_source="a") for i in range(3)])
    rows = [verl_row(i, f"b{i}", data_source="b") | {"extra_info": {"index": i, "note": "x"}} for i in range(2)]
    second = write_parquet(tmp_path / "b.parquet", rows)
    dataset = RLDataset([first, second], tokenizer)
    assert len(dataset) == 5
    assert [dataset[i].data_source for i in range(5)] == ["a", "a", "a", "b", "b"]
    assert [dataset[i].messages[0]["content"] for i in range(5)] == ["a0", "a1", "a2", "b0", "b1"]
    assert dataset[4].extra_info == {"index": 1, "note": "x"}


def test_optional_columns_may_be_absent(tmp_path, tokenizer):
    table = pa.table({
        "data_source": ["s"],
        "prompt": [[{"role": "user", "content": "hi"}]],
        "reward_model": [{"style": "rule", "ground_truth": "7"}],
    })
    pq.write_table(table, tmp_path / "min.parquet")
    sample = RLDataset(tmp_path / "min.parquet", tokenizer)[0]
    assert sample.ground_truth == "7" and sample.extra_info == {}


def test_missing_column_names_file_column_and_format(tmp_path, tokenizer):
    rows = [{k: v for k, v in verl_row(0, "hi").items() if k != "reward_model"}]
    path = write_parquet(tmp_path / "no_rm.parquet", rows)
    with pytest.raises(DataFormatError) as error:
        RLDataset(path, tokenizer)
    message = str(error.value)
    assert "no_rm.parquet" in message and "['reward_model']" in message and "ground_truth" in message
    assert "posttrain prepare" in message


def test_prompt_key_and_non_chat_prompt(tmp_path, tokenizer):
    rows = [verl_row(0, "hi") | {"question": [{"role": "user", "content": "other"}]}]
    path = write_parquet(tmp_path / "a.parquet", rows)
    assert RLDataset(path, tokenizer, prompt_key="question")[0].messages[0]["content"] == "other"
    with pytest.raises(DataFormatError, match="lacks column.*'chat'"):
        RLDataset(path, tokenizer, prompt_key="chat")
    bad = write_parquet(tmp_path / "bad.parquet", [verl_row(0, "x") | {"prompt": "a plain string"}])
    with pytest.raises(DataFormatError, match="bad.parquet row 0, prompt: 'a plain string' is not a list of chat messages"):
        RLDataset(bad, tokenizer)


def test_missing_file_says_how_to_make_one(tmp_path, tokenizer):
    with pytest.raises(DataFormatError, match="does not exist.*posttrain prepare"):
        RLDataset(tmp_path / "nope.parquet", tokenizer)


@pytest.fixture
def short_and_long(tmp_path, tokenizer):
    """Row 0 short, row 1 long; returns (path, long prompt's token ids, a limit between the two)."""
    path = write_parquet(tmp_path / "mix.parquet", [verl_row(0, "short"), verl_row(1, "word " * 60)])
    long_ids, short_ids = _template_ids(tokenizer, "word " * 60), _template_ids(tokenizer, "short")
    assert len(short_ids) + 5 < len(long_ids)
    return path, long_ids, len(short_ids) + 5


def test_overlong_prompts_are_filtered_and_counted(short_and_long, tokenizer, caplog):
    path, long_ids, _ = short_and_long
    limit = len(long_ids) - 1
    with caplog.at_level(logging.WARNING, logger="posttrain.data.dataset"):
        dataset = RLDataset(path, tokenizer, max_prompt_length=limit, filter_overlong_prompts=True)
    assert len(dataset) == 1 and dataset.num_filtered == 1
    assert dataset[0].messages[0]["content"] == "short"
    assert f"dropped 1 of 2 prompts longer than max_prompt_length={limit}" in caplog.text
    # Exactly at the limit is kept.
    assert len(RLDataset(path, tokenizer, max_prompt_length=len(long_ids))) == 2


def test_truncation_error_names_sample_length_limit_and_fix(short_and_long, tokenizer):
    path, long_ids, limit = short_and_long
    with pytest.raises(PromptTooLongError) as error:
        RLDataset(path, tokenizer, max_prompt_length=limit, filter_overlong_prompts=False, truncation="error")
    message = str(error.value)
    assert f"prompt 1 (row 1 of {path})" in message
    assert f"is {len(long_ids)} tokens" in message and f"max_prompt_length={limit}." in message
    assert f"at least {len(long_ids)}" in message
    assert "data.filter_overlong_prompts=true" in message and "data.truncation=left" in message


def test_truncation_left_and_right(short_and_long, tokenizer):
    path, long_ids, limit = short_and_long
    left = RLDataset(path, tokenizer, max_prompt_length=limit, filter_overlong_prompts=False, truncation="left")
    right = RLDataset(path, tokenizer, max_prompt_length=limit, filter_overlong_prompts=False, truncation="right")
    assert left[1].prompt_ids == long_ids[-limit:] and right[1].prompt_ids == long_ids[:limit]
    assert left[0].prompt_ids == right[0].prompt_ids == _template_ids(tokenizer, "short")


def test_bad_truncation_mode_and_everything_filtered(short_and_long, tokenizer):
    path, _, _ = short_and_long
    with pytest.raises(ValueError, match="truncation='middle'"):
        RLDataset(path, tokenizer, truncation="middle")
    with pytest.raises(ValueError, match="no prompts left out of 2"):
        RLDataset(path, tokenizer, max_prompt_length=3)


def test_tokenizer_without_chat_template_is_rejected(tokenizer):
    class NoTemplate:
        chat_template = None
        name_or_path = "plain-gpt2"

    with pytest.raises(ValueError, match="'plain-gpt2' has no chat template"):
        tokenize_prompts([[{"role": "user", "content": "x"}]], NoTemplate())
