"""`posttrain prepare bfcl`: rows and SFT transcripts from bfcl-eval's own files, BFCL's types as JSON
Schema, training prompts over the cap dropped and counted, held-out ones never."""

import json
import re
from collections import Counter

import pytest
from tests.data.helpers import parquet_rows as _rows
from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.cli import main  # noqa: E402
from posttrain.data import prepare, read_rows  # noqa: E402
from posttrain.data.preparers.bfcl import NO_FUNCTION_ANSWER, load_category, tool_schemas  # noqa: E402
from posttrain.errors import InputError  # noqa: E402
from posttrain.models import cached_tiny_model, load_tokenizer, tokenize_prompts  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402

TRAIN = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance")
TEST = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")


def _function(category: str, question_id: str, name: str) -> dict:
    """Function ``name`` of BFCL question ``question_id`` as the rows' tool schema."""
    question = next(q for q in load_category(category) if q.id == question_id)
    return next(s["function"] for s in tool_schemas(question.functions) if s["function"]["name"] == name)


def test_small_run_writes_rows_transcripts_and_report(tmp_path, capsys):
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=12", "sft_val_size=4"]) == 0
    printed = capsys.readouterr().out
    assert "train: 60 rows: live_simple 12, live_multiple 12, live_parallel 12, live_parallel_multiple 12, live_irrelevance 12" in printed
    assert "test: 60 rows: simple_python 12, multiple 12, parallel 12, parallel_multiple 12, irrelevance 12" in printed
    assert "SFT transcripts: 56 train, 4 validation" in printed
    assert "Apache-2.0" in (tmp_path / "README.md").read_text() and "bfcl-eval 2026.3.23" in (tmp_path / "README.md").read_text()
    for split, categories in (("train", TRAIN), ("test", TEST)):
        rows = _rows(tmp_path / f"{split}.parquet")
        assert [r["extra_info"]["category"] for r in rows] == [c for c in categories for _ in range(12)]
        assert [r["extra_info"]["index"] for r in rows] == list(range(60))
        assert {r["data_source"] for r in rows} == {"bfcl"} and {r["extra_info"]["split"] for r in rows} == {split}
        assert len(read_rows([tmp_path / f"{split}.parquet"])) == 60  # posttrain's own row checks pass
        first = rows[0]
        question = load_category(categories[0], limit=1)[0]
        assert first["extra_info"]["id"] == question.id and first["prompt"] == question.messages
        assert json.loads(first["reward_model"]["ground_truth"]) == question.ground_truth
        assert json.loads(first["extra_info"]["bfcl_functions"]) == question.functions
        assert json.loads(first["extra_info"]["tools"]) == tool_schemas(question.functions)
    assert not any("reference_answer" in r["extra_info"] for r in _rows(tmp_path / "test.parquet"))  # held-out rows carry no answer text
    irrelevant = [r for r in _rows(tmp_path / "test.parquet") if r["extra_info"]["category"] == "irrelevance"]
    assert {r["reward_model"]["ground_truth"] for r in irrelevant} == {"[]"}


def test_transcripts_are_the_answers_as_hermes_calls_that_bfcl_accepts(tmp_path):
    prepare("bfcl", tmp_path, limit=12, sft_val_size=4)
    transcripts = _rows(tmp_path / "sft.parquet") + _rows(tmp_path / "sft_val.parquet")
    train = {r["extra_info"]["id"]: r for r in _rows(tmp_path / "train.parquet")}
    assert sorted(t["extra_info"]["id"] for t in transcripts) == sorted(train)
    for sample in transcripts:
        info, (*prompt, answer) = sample["extra_info"], sample["messages"]
        assert info == train[info["id"]]["extra_info"] and prompt == train[info["id"]]["prompt"] and answer["role"] == "assistant"
        assert info["reference_answer"] == answer["content"]  # what algorithm.guidance gives a group with no right answer
        if info["category"] == "live_irrelevance":
            assert answer["content"] == NO_FUNCTION_ANSWER
            continue
        blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", answer["content"])
        assert "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in blocks) == answer["content"]
        calls = [json.loads(block) for block in blocks]
        assert bfcl.compute_score(answer["content"], train[info["id"]]["reward_model"]["ground_truth"], info, calls=calls)["score"] == 1.0
    parallel = next(t for t in transcripts if t["extra_info"]["id"] == "live_parallel_0-0-0")["messages"][-1]["content"]
    assert parallel == ('<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Beijing, China"}}\n</tool_call>\n'
                        '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Shanghai, China"}}\n</tool_call>')


def test_bfcl_types_become_json_schema():
    distance = _function("simple_python", "simple_python_83", "calculate_distance")  # tuple of float
    assert distance["parameters"]["type"] == "object"
    assert distance["parameters"]["properties"]["coord1"] == {"type": "array", "items": {"type": "number"},
                                                               "description": "The first coordinate as (latitude, longitude)."}
    query = _function("simple_python", "simple_python_96", "database.query")  # array of dict, nested properties with enum
    conditions = query["parameters"]["properties"]["conditions"]
    assert conditions["type"] == "array" and conditions["items"]["type"] == "object"
    assert conditions["items"]["required"] == ["field", "operation", "value"]
    assert conditions["items"]["properties"]["operation"] == {"type": "string", "description": "The operation to be performed.",
                                                              "enum": ["<", ">", "=", ">=", "<="]}
    budget = _function("multiple", "multiple_8", "realestate.find_properties")["parameters"]["properties"]["budget"]  # dict of float
    assert budget["type"] == "object" and {p["type"] for p in budget["properties"].values()} == {"number"}
    value = _function("live_simple", "live_simple_117-73-0", "reverse_input")["parameters"]["properties"]["input_value"]
    assert value["type"] == "string"  # BFCL's "any": its checker wants a string
    year = _function("simple_python", "simple_python_182", "lawsuit_info")["parameters"]["properties"]["year"]
    assert year == {"type": "integer", "description": "The year in which the lawsuit case was initiated. Default is 2023 if not specified.",
                    "default": 2023}  # BFCL's "optional" flag dropped


def test_prompts_over_the_cap_are_dropped_from_train_only(tmp_path, capsys):
    tokenizer_dir = cached_tiny_model("llama")
    prepare("bfcl", tmp_path, limit=10, sft_val_size=2, max_prompt_tokens=300, tokenizer=str(tokenizer_dir))
    printed = capsys.readouterr().out
    tokenizer = load_tokenizer(tokenizer_dir)
    kept = {r["extra_info"]["id"] for r in _rows(tmp_path / "train.parquet")}
    expected_dropped = 0
    for category in TRAIN:
        for question in load_category(category, limit=10):
            length = len(tokenize_prompts([question.messages], tokenizer, tool_schemas(question.functions))[0])
            assert (question.id in kept) == (length <= 300), (question.id, length)
            expected_dropped += length > 300
    assert 0 < expected_dropped < 50
    assert f"dropped from train as longer than 300 prompt tokens: {expected_dropped} (" in printed
    assert len(_rows(tmp_path / "test.parquet")) == 50  # held-out rows are never dropped ...
    assert re.search(r"held-out rows longer than 300, kept: [1-9]", printed)  # ... though some are longer
    assert len(_rows(tmp_path / "sft.parquet")) + len(_rows(tmp_path / "sft_val.parquet")) == 50 - expected_dropped


def test_rl_prompt_tokens_keeps_the_longer_rows_for_rl_alone(tmp_path, capsys):
    """rl_prompt_tokens: the rows over max_prompt_tokens but within it join train.parquet marked rl_only, with no SFT
    transcript; the SFT files, the added and development rows, and the rows SFT holds back are those of max_prompt_tokens
    alone; joined_values renames the longer rows as it does the others."""
    tokenizer_dir = cached_tiny_model("llama")
    tokenizer = load_tokenizer(tokenizer_dir)
    options = {"limit": 30, "sft_val_size": 8, "max_prompt_tokens": 300, "tokenizer": str(tokenizer_dir), "multi_turn": "",
               "parallel_pairs": 3, "dev_swapped": 3, "joined_values": True}
    prepare("bfcl", tmp_path / "capped", **options)
    capsys.readouterr()
    prepare("bfcl", tmp_path / "rl", rl_prompt_tokens=450, **options)
    printed = capsys.readouterr().out
    lengths = {q.id: len(tokenize_prompts([q.messages], tokenizer, tool_schemas(q.functions))[0])
               for category in TRAIN for q in load_category(category, limit=30)}
    longer = {i for i, n in lengths.items() if 300 < n <= 450}
    assert 0 < len(longer) and any(n > 450 for n in lengths.values())
    for name in ("sft.parquet", "sft_val.parquet", "dev_swapped.parquet", "test.parquet"):
        assert _rows(tmp_path / "rl" / name) == _rows(tmp_path / "capped" / name)
    assert len(_rows(tmp_path / "rl" / "dev_swapped.parquet")) > 0
    capped, train = _rows(tmp_path / "capped" / "train.parquet"), _rows(tmp_path / "rl" / "train.parquet")
    assert any(r["extra_info"]["category"] == "synthetic_parallel" for r in capped)
    # the capped file's rows, added ones included, come first as they were; the longer rows after them
    assert capped == train[:len(capped)] and not any(r["extra_info"]["rl_only"] for r in capped)
    assert {r["extra_info"]["id"] for r in train[len(capped):]} == longer
    for row in train[len(capped):]:
        info = row["extra_info"]
        assert info["rl_only"] and not info["in_sft"] and info.get("reference_answer") is None
    joined = [r for r in train[len(capped):] if r["extra_info"]["category"].endswith("_joined")]
    assert joined and all(r["extra_info"]["category"].removesuffix("_joined") + "_" in r["extra_info"]["id"] for r in joined)
    added = sum(r["extra_info"]["category"] == "synthetic_parallel" for r in train)
    assert f"train: {len(train) - added} rows: " in printed
    assert f"of the train rows, kept for RL alone, longer than 300 prompt tokens and within 450 (rl_prompt_tokens; no SFT transcript, " \
           f"never a development row): {len(longer)} (" in printed
    assert f"dropped from train as longer than 450 prompt tokens: {sum(n > 450 for n in lengths.values())} (" in printed
    for bad, message in (({"rl_prompt_tokens": 400}, "give max_prompt_tokens"),
                         ({"rl_prompt_tokens": 300, "max_prompt_tokens": 300}, "an rl_prompt_tokens above it"),
                         ({"rl_prompt_tokens": 400, "max_prompt_tokens": 300, "no_call_share": 0.1}, "data.sampler.shares")):
        with pytest.raises(InputError, match=message):
            prepare("bfcl", tmp_path / "bad", limit=2, **bad)
    assert not (tmp_path / "bad").exists()


def test_bad_options_are_refused_before_writing(tmp_path):
    with pytest.raises(InputError, match="'simple_java'.*not among BFCL's single-turn Python categories"):
        prepare("bfcl", tmp_path / "a", test_categories="simple_python,simple_java")
    with pytest.raises(InputError, match="\\['irrelevance'\\] are in both"):
        prepare("bfcl", tmp_path / "b", train_categories="live_simple,irrelevance")
    with pytest.raises(InputError, match="limit=0"):
        prepare("bfcl", tmp_path / "c", limit=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_no_call_share_caps_the_training_rows_whose_answer_is_no_call(tmp_path, capsys):
    """48 rows with calls and 12 live_irrelevance ones: at most 10 % no-call rows keeps 5 of those (5/53)."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=12", "sft_val_size=4", "no_call_share=0.1"]) == 0
    printed = capsys.readouterr().out
    rows = _rows(tmp_path / "train.parquet")
    categories = Counter(r["extra_info"]["category"] for r in rows)
    assert categories == {"live_simple": 12, "live_multiple": 12, "live_parallel": 12, "live_parallel_multiple": 12, "live_irrelevance": 5}
    assert "train: 53 rows:" in printed and "dropped from train for no_call_share=0.1: 7 (live_irrelevance 7)" in printed
    assert [r["extra_info"]["index"] for r in rows] == list(range(53))
    assert len(_rows(tmp_path / "test.parquet")) == 60  # held-out rows are never dropped
    with pytest.raises(InputError, match="no_call_share=0"):
        prepare("bfcl", tmp_path / "bad", limit=2, no_call_share=0)


def test_sft_validation_questions_are_the_rl_development_candidates_with_or_without_the_no_call_cut(tmp_path):
    """Rows an SFT transcript teaches are marked ``in_sft`` (data.dev_size never holds them back); the
    SFT-validation questions are not, and they are the same questions whether no_call_share cuts or not:
    so an RL preset with the cut validates on questions the SFT preset (without it) never trained on."""
    prepare("bfcl", tmp_path / "sft", limit=12, sft_val_size=8)
    prepare("bfcl", tmp_path / "rl", limit=12, sft_val_size=8, no_call_share=0.1)
    ids = {name: {part: {r["extra_info"]["id"] for r in _rows(tmp_path / name / f"{part}.parquet")} for part in ("sft", "sft_val")}
           for name in ("sft", "rl")}
    assert len(ids["sft"]["sft_val"]) == 8 and ids["rl"]["sft_val"] <= ids["sft"]["sft_val"]
    for name in ("sft", "rl"):
        train = _rows(tmp_path / name / "train.parquet")
        taught = {r["extra_info"]["id"] for r in train if r["extra_info"]["in_sft"]}
        assert taught == ids[name]["sft"] and not taught & ids["sft"]["sft_val"]
    rl_train = {r["extra_info"]["id"] for r in _rows(tmp_path / "rl" / "train.parquet")}
    assert ids["rl"]["sft_val"] == ids["sft"]["sft_val"] & rl_train  # a held question the cut kept is still held


def test_near_irrelevance_names_the_live_irrelevance_rows_whose_question_shares_words_with_the_functions(tmp_path, capsys):
    """near_irrelevance=true: the live_irrelevance training rows whose question shares a subject word with their functions
    take the category live_irrelevance_near; every row is otherwise the same, in the same order; held-out rows keep theirs."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=80", "sft_val_size=8", "near_irrelevance=true", "multi_turn="]) == 0
    assert re.search(r"train: 280 rows: .*, live_irrelevance \d+, live_irrelevance_near [1-9]", capsys.readouterr().out)
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=80, sft_val_size=8, multi_turn="")
    near, before = _rows(tmp_path / "train.parquet"), _rows(plain / "train.parquet")
    renamed = [(a, b) for a, b in zip(near, before) if a != b]
    assert len(near) == len(before) and renamed and all(a["extra_info"]["category"] == "live_irrelevance_near" for a, _ in renamed)
    for a, b in renamed:
        assert b["extra_info"]["category"] == "live_irrelevance" and a | {"extra_info": b["extra_info"]} == b
        assert {k: v for k, v in a["extra_info"].items() if k != "category"} == {k: v for k, v in b["extra_info"].items() if k != "category"}
        assert bfcl.check_calls([], [], a["extra_info"]).valid  # still judged as an irrelevance row
    for row in near:
        if row["extra_info"]["category"].startswith("live_irrelevance"):
            shares = bool(bfcl.question_words(row["prompt"][-1]["content"]) & bfcl.subject_words(json.loads(row["extra_info"]["bfcl_functions"])))
            assert shares is (row["extra_info"]["category"] == "live_irrelevance_near")
    assert _rows(tmp_path / "test.parquet") == _rows(plain / "test.parquet")
