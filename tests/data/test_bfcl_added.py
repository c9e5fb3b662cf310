"""`posttrain prepare bfcl`'s added rows (posttrain/data/preparers/bfcl_added.py): questions asked together
(parallel_pairs, union_pairs, dev_pairs, most_calls), asked with functions about something else or without the ones they
need (swapped_irrelevance, masked_irrelevance and their dev_ files), and asked with their function among others'
(distractors, dev_distractors); the rows asking several values of one argument are in test_bfcl_values.py."""

import json
import re
from collections import Counter

import pytest
from tests.data.helpers import parquet_rows as _rows
from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.cli import main  # noqa: E402
from posttrain.data import prepare  # noqa: E402
from posttrain.data.preparers.bfcl import NO_FUNCTION_ANSWER, load_category  # noqa: E402
from posttrain.errors import InputError  # noqa: E402
from posttrain.models import cached_tiny_model, load_tokenizer, tokenize_prompts  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402


def _added(tmp_path, capsys, option: str, dev_option: str, category: str, asked_from: str, prefix: str):
    """``prepare bfcl`` with ``option=8`` and ``dev_option=3`` (limit 80, 30 held back): checks the report's two lines
    and that every other training row and transcript is as without them; returns (made, dev) as pairs (row, the asked
    question), the question ids → transcripts, and the training rows' ids → in_sft."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=80", "sft_val_size=30", f"{option}=8", f"{dev_option}=3",
                 "multi_turn="]) == 0
    printed = capsys.readouterr().out
    assert f"{category} rows ({option}=8): 8" in printed and f"{dev_option}.parquet ({dev_option}=3): 3" in printed
    train, sft = _rows(tmp_path / "train.parquet"), _rows(tmp_path / "sft.parquet")
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=80, sft_val_size=30, multi_turn="")
    assert _rows(plain / "train.parquet") == [r for r in train if r["extra_info"]["category"] != category]
    assert _rows(plain / "sft.parquet") == [r for r in sft if r["extra_info"]["category"] != category]
    assert _rows(plain / "sft_val.parquet") == _rows(tmp_path / "sft_val.parquet")
    questions = {q.id: q for q in load_category(asked_from, 80)}
    pairs = [[(r, questions[r["extra_info"]["id"].removeprefix(prefix)]) for r in rows]
             for rows in ([r for r in train if r["extra_info"]["category"] == category], _rows(tmp_path / f"{dev_option}.parquet"))]
    assert [len(rows) for rows in pairs] == [8, 3]
    return pairs, {r["extra_info"]["id"]: r["messages"] for r in sft}, {r["extra_info"]["id"]: r["extra_info"]["in_sft"] for r in train}


def test_parallel_pairs_ask_two_taught_questions_with_the_same_functions_at_once(tmp_path, capsys):
    """parallel_pairs=N: N rows of two live_simple questions asked in one message, answered by both calls,
    which BFCL's parallel rule accepts together and refuses apart; built only from questions SFT teaches."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=60", "sft_val_size=8", "parallel_pairs=6", "multi_turn="]) == 0
    assert "synthetic_parallel rows (parallel_pairs=6): 6" in capsys.readouterr().out
    train = _rows(tmp_path / "train.parquet")
    simple = {r["extra_info"]["id"]: r for r in train if r["extra_info"]["category"] == "live_simple"}
    pairs = [r for r in train if r["extra_info"]["category"] == "synthetic_parallel"]
    assert len(pairs) == 6 and len({r["extra_info"]["id"] for r in pairs}) == 6
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in _rows(tmp_path / "sft.parquet")}
    for row in pairs:
        first, second = (simple[part] for part in row["extra_info"]["id"].removeprefix("pair_").split("+"))
        assert first["extra_info"]["in_sft"] and second["extra_info"]["in_sft"] and row["extra_info"]["in_sft"]
        assert row["prompt"] == [{"role": "user", "content": first["prompt"][0]["content"] + "\n\n" + second["prompt"][0]["content"]}]
        assert row["extra_info"]["bfcl_functions"] == first["extra_info"]["bfcl_functions"] == second["extra_info"]["bfcl_functions"]
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth == json.loads(first["reward_model"]["ground_truth"]) + json.loads(second["reward_model"]["ground_truth"])
        calls = [json.loads(block) for block in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", transcripts[row["extra_info"]["id"]][-1]["content"])]
        assert len(calls) == 2 and bfcl.check_calls(calls, truth, row["extra_info"]).valid
        assert not bfcl.check_calls(calls[:1], truth, row["extra_info"]).valid  # one call where two are asked: refused
    without = _rows(prepare("bfcl", tmp_path / "plain", limit=60, sft_val_size=8, multi_turn="")[0])
    untaught = {r["extra_info"]["id"] for r in without if not r["extra_info"]["in_sft"]}
    assert untaught == {r["extra_info"]["id"] for r in train if not r["extra_info"]["in_sft"]}  # the development candidates stay
    with pytest.raises(InputError, match="parallel_pairs"):
        prepare("bfcl", tmp_path / "bad", limit=2, parallel_pairs=-1)


def test_swapped_irrelevance_asks_a_taught_question_with_functions_about_something_else(tmp_path, capsys):
    """swapped_irrelevance=N: N irrelevance rows whose question is a taught live_simple/live_multiple one and whose
    functions are another taught question's, about something else; no call is right, and SFT says so."""
    from posttrain.rewards.bfcl import subject_words as _subject_words

    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=60", "sft_val_size=8", "swapped_irrelevance=10", "multi_turn="]) == 0
    assert "swapped_irrelevance rows (swapped_irrelevance=10): 10" in capsys.readouterr().out
    train = _rows(tmp_path / "train.parquet")
    taught = {r["extra_info"]["id"]: r for r in train if r["extra_info"]["in_sft"] and r["extra_info"]["category"] != "swapped_irrelevance"}
    swapped = [r for r in train if r["extra_info"]["category"] == "swapped_irrelevance"]
    assert len(swapped) == 10 and len({r["extra_info"]["id"].split("+")[0] for r in swapped}) == 10  # distinct questions
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in _rows(tmp_path / "sft.parquet")}
    for row in swapped:
        asked, donor = (taught[part] for part in row["extra_info"]["id"].removeprefix("swap_").split("+"))
        assert asked["extra_info"]["category"] in ("live_simple", "live_multiple") and row["extra_info"]["in_sft"]
        assert row["prompt"] == asked["prompt"] and row["extra_info"]["tools"] == donor["extra_info"]["tools"]
        assert not _subject_words(json.loads(asked["extra_info"]["bfcl_functions"])) & _subject_words(json.loads(donor["extra_info"]["bfcl_functions"]))
        assert row["reward_model"]["ground_truth"] == "[]" and transcripts[row["extra_info"]["id"]][-1]["content"] == NO_FUNCTION_ANSWER
        assert bfcl.check_calls([], [], row["extra_info"]).valid  # judged as an irrelevance row: no call is right
        stray = [{"name": json.loads(donor["extra_info"]["bfcl_functions"])[0]["name"], "arguments": {}}]
        assert not bfcl.check_calls(stray, [], row["extra_info"]).valid
    assert _subject_words([{"name": "get_weather", "description": "Today's forecast"}]) == {"get", "weather", "today", "forecast"}
    without = _rows(prepare("bfcl", tmp_path / "plain", limit=60, sft_val_size=8, multi_turn="")[0])
    assert {r["extra_info"]["id"] for r in without if not r["extra_info"]["in_sft"]} == \
        {r["extra_info"]["id"] for r in train if not r["extra_info"]["in_sft"]}  # the development candidates stay
    with pytest.raises(InputError, match="swapped_irrelevance"):
        prepare("bfcl", tmp_path / "bad", limit=2, swapped_irrelevance=-1)


def test_dev_swapped_asks_held_back_questions_with_held_back_functions_in_a_file_of_its_own(tmp_path, capsys):
    """dev_swapped=N: dev_swapped.parquet holds irrelevance rows made from the questions SFT validates on, each asked
    with another such question's functions (neither taught), in no training file; train.parquet is unchanged."""
    from posttrain.rewards.bfcl import subject_words as _subject_words

    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=60", "sft_val_size=40", "dev_swapped=6", "multi_turn="]) == 0
    assert "dev_swapped.parquet (dev_swapped=6): 6 swapped_irrelevance rows" in capsys.readouterr().out
    train = _rows(tmp_path / "train.parquet")
    held = {r["extra_info"]["id"]: r for r in train if not r["extra_info"]["in_sft"]}
    dev = _rows(tmp_path / "dev_swapped.parquet")
    assert len(dev) == 6 and len({r["extra_info"]["id"].split("+")[0] for r in dev}) == 6
    for row in dev:
        asked, donor = (held[part] for part in row["extra_info"]["id"].removeprefix("swap_").split("+"))
        assert asked["extra_info"]["category"] in ("live_simple", "live_multiple") and not row["extra_info"]["in_sft"]
        assert row["extra_info"]["category"] == "swapped_irrelevance" and row["reward_model"]["ground_truth"] == "[]"
        assert row["prompt"] == asked["prompt"] and row["extra_info"]["tools"] == donor["extra_info"]["tools"]
        assert not _subject_words(json.loads(asked["extra_info"]["bfcl_functions"])) & _subject_words(json.loads(donor["extra_info"]["bfcl_functions"]))
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=60, sft_val_size=40, multi_turn="")
    assert _rows(plain / "train.parquet") == train and not (plain / "dev_swapped.parquet").exists()
    assert _rows(plain / "sft.parquet") == _rows(tmp_path / "sft.parquet")


def _pairs_are_two_questions_with_both_functions(rows, asked, *, taught):
    """Each row two of ``asked``'s live_simple/live_multiple questions in one message with both questions' functions,
    answered by both calls, which BFCL's parallel rule accepts together and refuses apart; some (``taught``: all)
    second questions bring functions of their own."""
    several = 0
    for row in rows:
        first, second = (asked[part] for part in row["extra_info"]["id"].removeprefix("pair_").split("+"))
        assert {first["extra_info"]["category"], second["extra_info"]["category"]} <= {"live_simple", "live_multiple"}
        assert row["extra_info"]["category"] == "synthetic_parallel_multiple" and row["extra_info"]["in_sft"] == taught
        assert row["prompt"] == [{"role": "user", "content": first["prompt"][0]["content"] + "\n\n" + second["prompt"][0]["content"]}]
        functions = {f["name"]: f for r in (first, second) for f in json.loads(r["extra_info"]["bfcl_functions"])}
        assert sorted(f["name"] for f in json.loads(row["extra_info"]["bfcl_functions"])) == sorted(functions)
        several += len(functions) > len(json.loads(first["extra_info"]["bfcl_functions"]))
        truths = [json.loads(r["reward_model"]["ground_truth"]) for r in (first, second)]
        assert json.loads(row["reward_model"]["ground_truth"]) == truths[0] + truths[1]
        calls = [call for r, truth in zip((first, second), truths) for call in bfcl.answer_calls(truth, json.loads(r["extra_info"]["bfcl_functions"]))]
        assert len(calls) == 2 and bfcl.check_calls(calls, row["reward_model"]["ground_truth"], row["extra_info"]).valid
        assert not bfcl.check_calls(calls[1:], row["reward_model"]["ground_truth"], row["extra_info"]).valid
    assert several == len(rows) if taught else several  # the second question brought functions of its own


def test_dev_pairs_ask_two_held_back_questions_at_once_with_both_functions_in_a_file_of_its_own(tmp_path, capsys):
    """dev_pairs=N: dev_pairs.parquet holds two-call rows made from the questions SFT validates on (neither taught), two
    asked in one message with both questions' functions, answered by both calls, which BFCL's parallel rule accepts
    together and refuses apart; the training files are as without the option."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=60", "sft_val_size=40", "dev_pairs=6", "multi_turn="]) == 0
    assert "dev_pairs.parquet (dev_pairs=6): 6 synthetic_parallel_multiple rows" in capsys.readouterr().out
    held = {r["extra_info"]["id"]: r for r in _rows(tmp_path / "train.parquet") if not r["extra_info"]["in_sft"]}
    dev = _rows(tmp_path / "dev_pairs.parquet")
    assert len(dev) == 6 and len({r["extra_info"]["id"] for r in dev}) == 6
    _pairs_are_two_questions_with_both_functions(dev, held, taught=False)
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=60, sft_val_size=40, multi_turn="")
    assert _rows(plain / "train.parquet") == _rows(tmp_path / "train.parquet") and not (plain / "dev_pairs.parquet").exists()
    assert _rows(plain / "sft.parquet") == _rows(tmp_path / "sft.parquet")


def test_union_pairs_ask_two_taught_questions_at_once_with_both_functions_in_train_and_sft(tmp_path, capsys):
    """union_pairs=N: N training rows made as dev_pairs' are, from taught questions, each with its SFT transcript (both
    calls) and a second question that brings functions of its own, so none is a parallel_pairs row under another
    category; the development candidates and the other rows are as without the option."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=60", "sft_val_size=8", "union_pairs=6", "multi_turn="]) == 0
    assert "synthetic_parallel_multiple rows (union_pairs=6): 6" in capsys.readouterr().out
    train = _rows(tmp_path / "train.parquet")
    taught = {r["extra_info"]["id"]: r for r in train if r["extra_info"]["in_sft"]}
    pairs = [r for r in train if r["extra_info"]["category"] == "synthetic_parallel_multiple"]
    assert len(pairs) == 6 and len({r["extra_info"]["id"] for r in pairs}) == 6
    _pairs_are_two_questions_with_both_functions(pairs, taught, taught=True)
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in _rows(tmp_path / "sft.parquet")}
    for row in pairs:
        assert transcripts[row["extra_info"]["id"]][-1]["content"].count("<tool_call>") == 2
    plain = _rows(prepare("bfcl", tmp_path / "plain", limit=60, sft_val_size=8, multi_turn="")[0])
    assert plain == [r for r in train if r["extra_info"]["category"] != "synthetic_parallel_multiple"]
    both = prepare("bfcl", tmp_path / "both", limit=60, sft_val_size=8, parallel_pairs=300, union_pairs=300, multi_turn="")
    for path in both[0], both[2]:  # train.parquet, sft.parquet: every row once
        ids = [r["extra_info"]["id"] for r in _rows(path)]
        assert len(ids) == len(set(ids))
    with pytest.raises(InputError, match="union_pairs"):
        prepare("bfcl", tmp_path / "bad", limit=2, union_pairs=-1)


def test_most_calls_makes_pairs_that_ask_two_to_k_questions_each_answered_by_its_own_call(tmp_path, capsys):
    """most_calls=4: parallel_pairs and union_pairs rows ask 2 to 4 taught questions in one message (some of each size),
    answered by every question's call, which BFCL's parallel rule accepts together and refuses one call short; the SFT
    transcript writes them all, the report counts rows by calls asked, dev_pairs still asks two; below 2 is refused."""
    options = ["limit=150", "sft_val_size=40", "parallel_pairs=30", "union_pairs=30", "dev_pairs=6", "most_calls=4", "multi_turn="]
    assert main(["prepare", "bfcl", "--out", str(tmp_path), *options]) == 0
    assert re.search(r"synthetic_parallel rows \(parallel_pairs=30\): 30, .* \(by calls asked: 2: \d+, 3: \d+, 4: \d+\)",
                     capsys.readouterr().out)
    train = _rows(tmp_path / "train.parquet")
    taught = {r["extra_info"]["id"]: r for r in train if r["extra_info"]["in_sft"]}
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in _rows(tmp_path / "sft.parquet")}
    for category in ("synthetic_parallel", "synthetic_parallel_multiple"):
        rows = [r for r in train if r["extra_info"]["category"] == category]
        sizes = Counter()
        for row in rows:
            asked = [taught[part] for part in row["extra_info"]["id"].removeprefix("pair_").split("+")]
            sizes[len(asked)] += 1
            assert row["prompt"][0]["content"] == "\n\n".join(q["prompt"][0]["content"] for q in asked)
            truth = [call for q in asked for call in json.loads(q["reward_model"]["ground_truth"])]
            assert json.loads(row["reward_model"]["ground_truth"]) == truth and len(truth) == len(asked)
            calls = [json.loads(b) for b in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", transcripts[row["extra_info"]["id"]][-1]["content"])]
            assert len(calls) == len(asked) and bfcl.check_calls(calls, truth, row["extra_info"]).valid
            assert not bfcl.check_calls(calls[:-1], truth, row["extra_info"]).valid
        assert len(rows) == 30 and set(sizes) <= {2, 3, 4} and len(sizes) > 1, sizes
    assert all(r["extra_info"]["id"].count("+") == 1 for r in _rows(tmp_path / "dev_pairs.parquet"))
    with pytest.raises(InputError, match="most_calls"):
        prepare("bfcl", tmp_path / "bad", limit=2, most_calls=1)


def test_dev_most_calls_and_dev_prompt_tokens_let_the_development_pairs_ask_three_and_four_questions(tmp_path, capsys):
    """dev_most_calls=4: dev_pairs rows ask 2 to 4 questions SFT holds back, answered by all their calls; they bring every
    question's functions, so under the training cap few of three or four fit: dev_prompt_tokens caps the dev rows alone,
    the training rows keep max_prompt_tokens. dev_most_calls below 2 and dev_prompt_tokens below 1 are refused."""
    tokenizer_dir = cached_tiny_model("llama")
    tokenizer = load_tokenizer(tokenizer_dir)
    options = {"limit": 150, "sft_val_size": 40, "dev_pairs": 12, "dev_most_calls": 4, "max_prompt_tokens": 600,
               "tokenizer": str(tokenizer_dir), "multi_turn": ""}

    def length(row):
        return len(tokenize_prompts([row["prompt"]], tokenizer, json.loads(row["extra_info"]["tools"]))[0])

    def asked(row):
        return row["extra_info"]["id"].removeprefix("pair_").split("+")

    prepare("bfcl", tmp_path / "capped", **options)
    capped = _rows(tmp_path / "capped" / "dev_pairs.parquet")
    assert all(length(r) <= 600 for r in capped)
    prepare("bfcl", tmp_path / "dev", dev_prompt_tokens=1200, **options)
    assert re.search(r"dev_pairs.parquet \(dev_pairs=12\): 12 .* \(by calls asked: 2: \d+, 3: \d+, 4: \d+\)", capsys.readouterr().out)
    train = _rows(tmp_path / "dev" / "train.parquet")
    assert all(length(r) <= 600 for r in train)
    held = {r["extra_info"]["id"]: r for r in train if not r["extra_info"]["in_sft"]}
    rows = _rows(tmp_path / "dev" / "dev_pairs.parquet")
    assert len(rows) == 12 and all(length(r) <= 1200 for r in rows) and any(length(r) > 600 for r in rows)
    assert set(Counter(len(asked(r)) for r in rows)) == {2, 3, 4}
    assert sum(len(asked(r)) > 2 for r in rows) > sum(len(asked(r)) > 2 for r in capped)
    for row in rows:
        truth = [call for part in asked(row) for call in json.loads(held[part]["reward_model"]["ground_truth"])]
        assert json.loads(row["reward_model"]["ground_truth"]) == truth and len(truth) == len(asked(row))
    for bad in ({"dev_most_calls": 1}, {"dev_prompt_tokens": 0}):
        with pytest.raises(InputError, match=next(iter(bad))):
            prepare("bfcl", tmp_path / "bad", limit=2, **bad)


def test_masked_irrelevance_asks_a_taught_question_without_the_functions_its_answer_calls(tmp_path, capsys):
    """masked_irrelevance=N: irrelevance rows whose question is a taught live_multiple one, asked with its own functions
    less the ones its answer calls and less their namesakes (uber.ride2 beside uber.ride); no call is right, SFT says
    so. dev_masked=N makes them from the questions SFT holds back, in dev_masked.parquet only."""
    from posttrain.data.preparers.bfcl_added import _stem_words

    (masked, dev), transcripts, in_sft = _added(tmp_path, capsys, "masked_irrelevance", "dev_masked", "masked_irrelevance",
                                                "live_multiple", "mask_")
    for (row, asked), taught in [(pair, True) for pair in masked] + [(pair, False) for pair in dev]:
        assert in_sft[asked.id] is taught and row["prompt"] == asked.messages  # taught questions train, held-back ones validate
        needed = {name for call in asked.ground_truth for name in call}
        kept = [f["name"] for f in json.loads(row["extra_info"]["bfcl_functions"])]
        assert kept and not needed & set(kept) and set(kept) < {f["name"] for f in asked.functions}
        assert not any(_stem_words(k) & _stem_words(n) for k in kept for n in needed)  # no namesake of a needed one kept
        assert row["reward_model"]["ground_truth"] == "[]" and bfcl.check_calls([], [], row["extra_info"]).valid
        assert not bfcl.check_calls([{"name": kept[0], "arguments": {}}], [], row["extra_info"]).valid
        assert transcripts[row["extra_info"]["id"]][-1]["content"] == NO_FUNCTION_ANSWER if taught else row["extra_info"]["id"] not in transcripts


def test_masked_rows_leave_out_the_namesakes_of_the_functions_the_answer_calls():
    """A function whose name shares a word (digits and leading verbs aside) with a called one could do the same job:
    it goes too; a function about something else stays; a question with nothing left is skipped."""
    from posttrain.data.preparers.bfcl import Question
    from posttrain.data.preparers.bfcl_added import masked

    def question(qid, names, called):
        return Question(qid, "live_multiple", [{"role": "user", "content": "Get me a ride"}],
                        [{"name": n, "description": ""} for n in names], [{called: {}}])

    rows = masked([question("a", ["uber.ride", "uber.ride2", "get_weather"], "uber.ride"),
                   question("b", ["uber.ride", "uber.ride2"], "uber.ride"),
                   question("c", ["get_ride", "get_weather"], "get_ride")], 5, 0, lambda q: False)
    assert {r.id: [f["name"] for f in r.functions] for r in rows} == {"mask_a": ["get_weather"], "mask_c": ["get_weather"]}
    both = [question("a", ["uber.ride", "get_weather"], "uber.ride"), question("c", ["get_ride", "get_weather"], "get_ride")]
    assert len(masked(both, 1, 0, lambda q: False)) == 1  # count rows at most
    assert [r.id for r in masked(both, 5, 0, lambda q: q.id == "mask_a")] == ["mask_c"]  # a row over the cap is left out
    assert all(r.category == "masked_irrelevance" and r.ground_truth == [] for r in rows)


def test_distractors_ask_a_taught_question_with_its_function_among_others(tmp_path, capsys):
    """distractors=N: a taught live_simple question asked with its function among 1 to 3 other questions' functions (no
    namesake of its own), answered by its own call, judged by BFCL's multiple rule (the right call passes, a call of an
    added function fails), its SFT transcript its own call. dev_distractors=N makes them from the questions SFT holds
    back, in dev_distractors.parquet only; every other row and transcript is as without the options."""
    from posttrain.data.preparers.bfcl_added import _stem_words

    (made, dev), transcripts, in_sft = _added(tmp_path, capsys, "distractors", "dev_distractors", "synthetic_multiple",
                                              "live_simple", "distract_")
    sizes = Counter()
    for (row, asked), taught in [(pair, True) for pair in made] + [(pair, False) for pair in dev]:
        assert in_sft[asked.id] is taught and row["prompt"] == asked.messages  # taught questions train, held-back ones validate
        own, offered = asked.functions[0], json.loads(row["extra_info"]["bfcl_functions"])
        others = [f for f in offered if f != own]
        assert own in offered and 1 <= len(others) <= 3 and len({f["name"] for f in offered}) == len(offered)
        assert not any(_stem_words(f["name"]) & _stem_words(own["name"]) for f in others)  # no namesake of its own
        sizes[len(offered)] += 1
        assert json.loads(row["reward_model"]["ground_truth"]) == asked.ground_truth
        right = bfcl.answer_calls(asked.ground_truth, offered)
        assert bfcl.check_calls(right, asked.ground_truth, row["extra_info"]).valid
        assert not bfcl.check_calls([{"name": others[0]["name"], "arguments": right[0]["arguments"]}], asked.ground_truth, row["extra_info"]).valid
        if taught:
            assert transcripts[row["extra_info"]["id"]][-1] == transcripts[asked.id][-1]  # its own call, as SFT teaches it alone
        else:
            assert row["extra_info"]["id"] not in transcripts
    assert len(sizes) > 1  # 2 to 4 functions, not one number


def test_distractors_put_near_functions_first_and_leave_out_namesakes_and_the_question_s_words():
    """An added function sharing a subject word with the question's own is drawn before one about something else; one
    whose name shares a word with the own function's name or the question's words, or whose subject words hold the
    question's longer words, is never drawn; the number drawn varies; a question with no function to add is skipped;
    a row over the cap offers one function fewer, down to two."""
    from posttrain.data.preparers.bfcl import Question
    from posttrain.data.preparers.bfcl_added import distractors

    def question(qid, name, description, text="Book me a table"):
        return Question(qid, "live_simple", [{"role": "user", "content": text}], [{"name": name, "description": description}],
                        [{name: {}}])

    asked = question("a", "book_restaurant", "Reserve a table at a restaurant")
    donors = [question("b", "find_restaurant_reviews", "Reviews of a restaurant"),  # its name shares "restaurant" with the own one's
              question("c", "order_taxi", "Order a taxi to a restaurant"),  # near: its description shares "restaurant"
              question("d", "table_tennis_scores", "Scores of matches"),  # its name shares "table" with the question
              question("g", "seat_finder", "Finds a free table"),  # its description holds the question's "table"
              question("e", "get_stock_price", "Price of a stock"),  # about something else
              question("f", "list_tables", "Lists database tables", text="x")]  # about something else ("tables" is not "table")
    drawn, sizes = Counter(), set()
    for seed in range(12):
        (row,) = distractors([asked], donors, 1, seed, lambda q: False)
        names = [f["name"] for f in row.functions]
        drawn.update(names)
        sizes.add(len(names))
        assert "book_restaurant" in names and "order_taxi" in names  # the near one always comes first
        assert row.category == "synthetic_multiple" and row.ground_truth == asked.ground_truth and row.id == "distract_a"
    assert drawn["find_restaurant_reviews"] == drawn["table_tennis_scores"] == drawn["seat_finder"] == 0
    assert drawn["get_stock_price"] and drawn["list_tables"] and sizes == {2, 3, 4}
    adding = question("h", "calculator.sum", "Sums numbers", text="Add 2 and 3")  # "add", a name of a verb alone, is its word
    assert [r.functions for r in distractors([adding], [question("i", "add", "Adds numbers", text="y")], 1, 0, lambda q: False)] == []
    assert distractors([asked], [donors[0]], 1, 0, lambda q: False) == []  # only a namesake to add: skipped
    (short,) = distractors([asked], donors, 1, 3, lambda q: len(q.functions) > 2)
    assert len(short.functions) == 2 and "order_taxi" in [f["name"] for f in short.functions]  # one fewer, near kept
    assert distractors([asked], donors, 1, 0, lambda q: True) == []


def test_outside_irrelevance_asks_a_gsm8k_problem_with_a_taught_question_s_functions(tmp_path, capsys):
    """outside_irrelevance=N: irrelevance rows whose question is a GSM8K train word problem (the vendored copy), asked
    with the functions of a taught question that share no subject word with it and do no arithmetic; no call is
    right, SFT says so. dev_outside=N makes them from GSM8K's test problems and the held-back questions' functions, in
    dev_outside.parquet only; every other row and transcript is as without the options."""
    from posttrain.data.preparers import gsm8k
    from posttrain.data.preparers.bfcl_added import does_arithmetic

    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=80", "sft_val_size=30", "outside_irrelevance=8",
                 "dev_outside=3", "multi_turn="]) == 0
    printed = capsys.readouterr().out
    assert "outside_irrelevance rows (outside_irrelevance=8): 8" in printed and "dev_outside.parquet (dev_outside=3): 3" in printed
    train, sft = _rows(tmp_path / "train.parquet"), _rows(tmp_path / "sft.parquet")
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=80, sft_val_size=30, multi_turn="")
    assert _rows(plain / "train.parquet") == [r for r in train if r["extra_info"]["category"] != "outside_irrelevance"]
    assert _rows(plain / "sft.parquet") == [r for r in sft if r["extra_info"]["category"] != "outside_irrelevance"]
    assert all(_rows(plain / name) == _rows(tmp_path / name) for name in ("sft_val.parquet", "test.parquet"))
    in_sft = {r["extra_info"]["id"]: r["extra_info"]["in_sft"] for r in train}
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in sft}
    made = [r for r in train if r["extra_info"]["category"] == "outside_irrelevance"]
    for rows, split, taught in [(made, "train", True), (_rows(tmp_path / "dev_outside.parquet"), "test", False)]:
        problems = [p["question"] for p in gsm8k.vendored(split)]
        assert len(rows) == len({r["extra_info"]["id"] for r in rows}) == (8 if taught else 3)
        for row in rows:
            index, donor = row["extra_info"]["id"].removeprefix(f"outside_gsm8k-{split}-").split("+")
            assert row["prompt"] == [{"role": "user", "content": problems[int(index)]}] and in_sft[donor] is taught
            functions = json.loads(row["extra_info"]["bfcl_functions"])
            words = bfcl.subject_words(functions)
            assert not words & bfcl.question_words(problems[int(index)]) and not does_arithmetic(functions)
            assert row["reward_model"]["ground_truth"] == "[]" and bfcl.check_calls([], [], row["extra_info"]).valid
            assert not bfcl.check_calls([{"name": functions[0]["name"], "arguments": {}}], [], row["extra_info"]).valid
            assert transcripts[row["extra_info"]["id"]][-1]["content"] == NO_FUNCTION_ANSWER if taught else row["extra_info"]["id"] not in transcripts


def test_outside_rows_offer_no_calculator_and_nothing_the_problem_names():
    """A question whose functions do arithmetic, or share a longer word with the problem, never lends its functions; a
    problem with no question left is skipped; a row over the cap is left out; count rows at most, each problem once."""
    from posttrain.data.preparers import gsm8k
    from posttrain.data.preparers.bfcl import Question
    from posttrain.data.preparers.bfcl_added import outside

    def question(qid, name, description):
        return Question(qid, "live_simple", [{"role": "user", "content": "q"}], [{"name": name, "description": description}], [{name: {}}])

    problems = [p["question"] for p in gsm8k.vendored("train")]
    calculator = question("calc", "calculator.multiply", "Multiplies two numbers")
    weather = question("weather", "get_weather", "Current weather of a city")
    # a calculator by its description alone, in any form or language; "summary" and "multiple" are no arithmetic
    for name, description in [("get_area_of_square", "Calculates the area of a square"), ("obtener_cotizacion", "Calcula el pago mensual"),
                              ("stats", "The sum of the values"), ("loan_tool", "Computes a loan's monthly payment")]:
        assert outside("train", [question("x", name, description)], 3, 0, lambda q: False) == []
    assert len(outside("train", [question("y", "news_summary", "A summary of multiple stories")], 3, 0, lambda q: False)) == 3
    rows = outside("train", [calculator, weather], 20, 0, lambda q: False)
    assert len(rows) == 20 and len({r.id.split("+")[0] for r in rows}) == 20
    assert {r.id.split("+")[1] for r in rows} == {"weather"} and all(r.ground_truth == [] and r.category == "outside_irrelevance" for r in rows)
    assert all(r.messages[0]["content"] == problems[int(r.id.split("+")[0].rsplit("-", 1)[1])] for r in rows)
    # a donor sharing a problem's word lends to every problem but those that hold that word
    eggs = question("eggs", "egg_timer", "Counts minutes for boiling")
    for row in outside("train", [eggs], 40, 0, lambda q: False):
        assert not {"minutes", "boiling"} & {w.lower() for w in re.findall(r"[A-Za-z]{5,}", row.messages[0]["content"])}
    assert outside("train", [calculator], 5, 0, lambda q: False) == []
    assert outside("train", [weather], 5, 0, lambda q: True) == []
    assert outside("train", [weather], 0, 0, lambda q: False) == []
