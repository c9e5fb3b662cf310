"""SFT data: messages or prompt/response rows, Parquet or JSON lines, loss masks, overlong rows, bad rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posttrain import keys
from posttrain.data.sft_dataset import SFTDataError, SFTDataset
from posttrain.trainer.sft import transcripts_to_batch

CHAT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]


def _parquet(tmp_path, rows, name="sft.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_messages_and_pairs_give_the_same_transcript(tmp_path, tokenizer):
    messages = _parquet(tmp_path, [{"messages": CHAT, "extra_info": {"k": 1}}], "a.parquet")
    pairs = _parquet(tmp_path, [{"prompt": "What is 2+2?", "response": "4"}], "b.parquet")
    a, b = SFTDataset([messages], tokenizer, max_length=256), SFTDataset([pairs], tokenizer, max_length=256)
    assert a[0].transcript == b[0].transcript
    assert a[0].extra_info == {"k": 1}
    # "4" then eos, both trained; nothing of the prompt is
    assert a[0].transcript.loss_mask == [1, 1]


def test_jsonl_dumps_and_only_successful_episodes(tmp_path, tokenizer):
    path = tmp_path / "episodes.jsonl"
    rows = [{"messages": CHAT, "success": True}, {"messages": CHAT[:1] + [{"role": "assistant", "content": "5"}], "success": False}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert len(SFTDataset([path], tokenizer, max_length=256)) == 2
    kept = SFTDataset([path], tokenizer, max_length=256, require_success=True)
    assert len(kept) == 1 and kept.num_rows == 2


def test_overlong_rows_error_drop_or_lose_the_prompts_start(tmp_path, tokenizer):
    long_prompt = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]
    path = _parquet(tmp_path, [{"messages": CHAT}, {"messages": long_prompt}])
    full = SFTDataset([path], tokenizer, max_length=10_000)[1].transcript
    with pytest.raises(SFTDataError, match=r"row 1 is \d+ tokens .* over sft.max_length=100"):
        SFTDataset([path], tokenizer, max_length=100, truncation="error")
    dropped = SFTDataset([path], tokenizer, max_length=100, truncation="drop")
    assert len(dropped) == 1 and dropped.num_dropped == 1
    cut = SFTDataset([path], tokenizer, max_length=100, truncation="left")[1].transcript
    assert cut.length == 100 and cut.response_ids == full.response_ids
    assert cut.prompt_ids == full.prompt_ids[-(100 - len(full.response_ids)):]


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user", "content": "hi"}]}, r"row 0, field 'messages': .*no assistant message"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}, r"row 0, field 'messages': .*role 'bot'"),
    ({"text": "hello"}, r"row 0 has columns \['text'\]"),
    ({"prompt": "q", "response": 7}, r"row 0, field 'response'"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, tokenizer, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SFTDataError, match=message) as error:
        SFTDataset([path], tokenizer, max_length=256)
    assert str(path) in str(error.value)


def test_missing_files_and_bad_options(tmp_path, tokenizer):
    with pytest.raises(SFTDataError, match="does not exist"):
        SFTDataset([tmp_path / "nope.parquet"], tokenizer, max_length=256)
    with pytest.raises(ValueError, match="sft.truncation='middle'"):
        SFTDataset([tmp_path / "nope.parquet"], tokenizer, max_length=256, truncation="middle")


def test_batches_put_the_loss_on_assistant_tokens_only(tmp_path, tokenizer):
    two_turns = CHAT + [{"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]
    dataset = SFTDataset([_parquet(tmp_path, [{"messages": CHAT}, {"messages": two_turns}])], tokenizer, max_length=256)
    batch = transcripts_to_batch([dataset[0], dataset[1]], tokenizer.pad_token_id)
    mask, responses = batch[keys.RESPONSE_MASK], batch[keys.RESPONSE_IDS]
    assert mask.shape == responses.shape and batch[keys.INPUT_IDS].shape[1] == batch[keys.PROMPT_IDS].shape[1] + responses.shape[1]
    assert tokenizer.decode(responses[1][mask[1].bool()]) == "4<|im_end|>6<|im_end|>"
    assert tokenizer.decode(responses[0][mask[0].bool()]) == "4<|im_end|>"
    assert int(batch[keys.ATTENTION_MASK][0].sum()) == dataset[0].transcript.length


def test_a_json_line_that_is_not_an_object_is_refused(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('[1, 2]\n')
    with pytest.raises(SFTDataError, match="line 1 is list, not a JSON object"):
        SFTDataset([path], tokenizer, max_length=256)
