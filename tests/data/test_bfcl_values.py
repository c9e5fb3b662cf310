"""`posttrain prepare bfcl`'s rows that ask one function for several values of one argument (multi_value, dev_values,
values_from; posttrain/data/preparers/bfcl_added.py) and their counterpart, the one-call questions that join two arguments'
values with "and" (joins_values, joined_values)."""

import json
import re
from collections import Counter

import pytest
from tests.data.helpers import parquet_rows as _rows
from tests.data.test_bfcl_added import _added
from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.cli import main  # noqa: E402
from posttrain.data import prepare  # noqa: E402
from posttrain.data.preparers.bfcl import Question, load_category  # noqa: E402
from posttrain.data.preparers.bfcl_added import joins_values  # noqa: E402
from posttrain.errors import InputError  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402


def test_multi_value_asks_a_taught_question_for_several_values_one_call_each(tmp_path, capsys):
    """multi_value=N: a taught live_simple question whose value it writes is replaced by a list of 2 to most_calls values
    (its own among them), answered by one call per value, each otherwise its own call; BFCL's parallel rule accepts the
    SFT transcript's calls and refuses all but one of them; every other row and transcript is as without the option."""
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "limit=80", "sft_val_size=30", "multi_value=8", "most_calls=4",
                 "multi_turn="]) == 0
    assert "synthetic_parallel_values rows (multi_value=8): 8" in capsys.readouterr().out
    train, sft = _rows(tmp_path / "train.parquet"), _rows(tmp_path / "sft.parquet")
    plain = tmp_path / "plain"
    prepare("bfcl", plain, limit=80, sft_val_size=30, multi_turn="", most_calls=4)
    assert _rows(plain / "train.parquet") == [r for r in train if r["extra_info"]["category"] != "synthetic_parallel_values"]
    assert _rows(plain / "sft.parquet") == [r for r in sft if r["extra_info"]["category"] != "synthetic_parallel_values"]
    questions = {q.id: q for q in load_category("live_simple", 80)}
    in_sft = {r["extra_info"]["id"]: r["extra_info"]["in_sft"] for r in train}
    transcripts = {r["extra_info"]["id"]: r["messages"] for r in sft}
    made = [r for r in train if r["extra_info"]["category"] == "synthetic_parallel_values"]
    sizes = Counter()
    for row in made:
        asked = questions[row["extra_info"]["id"].removeprefix("values_")]
        assert in_sft[asked.id] and row["extra_info"]["in_sft"]  # taught questions only
        (name, args), = asked.ground_truth[0].items()
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth[0] == asked.ground_truth[0] and all(list(call) == [name] for call in truth)
        (param,) = {p for call in truth[1:] for p, v in call[name].items() if v != args[p]}  # one argument varies
        values = [call[name][param][0] for call in truth]
        assert len(set(map(str, values))) == len(values)
        text, own = asked.messages[0]["content"], row["prompt"][0]["content"]
        spoken = [str(v).removesuffix(".0") if not isinstance(v, str) else v for v in values]
        quote = next(q for q in ("'", '"', "") if text.count(q + spoken[0] + q) == 1)  # the question writes its value once
        words = [quote + v + quote for v in spoken]
        between = "; " if any("," in w for w in words) else ", "
        assert own == text.replace(quote + spoken[0] + quote, between.join(words[:-1]) + " and " + words[-1])
        sizes[len(values)] += 1
        calls = [json.loads(block) for block in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", transcripts[row["extra_info"]["id"]][-1]["content"])]
        assert len(calls) == len(values) and bfcl.check_calls(calls, truth, row["extra_info"]).valid
        assert not bfcl.check_calls(calls[:-1], truth, row["extra_info"]).valid  # a value left out: refused
    assert len(sizes) > 1 and max(sizes) <= 4


def test_dev_values_asks_held_back_questions_for_several_values(tmp_path, capsys):
    """dev_values=N: multi_value rows made from the questions SFT holds back, in dev_values.parquet only (no training row
    or transcript changes); each is its question's own call and one call per added value, as BFCL's parallel rule reads it."""
    (made, dev), transcripts, in_sft = _added(tmp_path, capsys, "multi_value", "dev_values", "synthetic_parallel_values",
                                              "live_simple", "values_")
    for (row, asked), taught in [(pair, True) for pair in made] + [(pair, False) for pair in dev]:
        assert in_sft[asked.id] is taught and (row["extra_info"]["id"] in transcripts) is taught
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth[0] == asked.ground_truth[0] and len(truth) >= 2 and row["prompt"][0]["content"] != asked.messages[0]["content"]
        (name, args), = asked.ground_truth[0].items()
        varied = {p for call in truth[1:] for p, v in call[name].items() if v != args[p]}
        assert len(varied) == 1 and all(set(call[name]) == set(args) for call in truth)  # one argument, one call per value
        right = bfcl.answer_calls(truth, asked.functions)
        assert bfcl.check_calls(right, truth, row["extra_info"]).valid and not bfcl.check_calls(right[:1], truth, row["extra_info"]).valid
    assert all(len(json.loads(row["reward_model"]["ground_truth"])) == 2 for row, _ in dev)  # dev_most_calls=2 by default


def test_multi_value_lists_values_in_their_quotes_and_skips_what_it_cannot_list():
    """The value's quotes go round each listed value; "; " parts values that hold a comma; the other values come from
    other questions' answers for the same function and parameter, or its enum, or (numbers only) nearby numbers of its
    type; a value written twice, inside a longer number, or a bool is not listed; a string with no other value is
    skipped; a row over the cap lists one value fewer, down to two."""
    from posttrain.data.preparers.bfcl import Question
    from posttrain.data.preparers.bfcl_added import multi_value

    def question(qid, text, args, properties=None):
        doc = {"name": "f", "parameters": {"type": "dict", "properties": properties or {}}}
        return Question(qid, "live_simple", [{"role": "user", "content": text}], [doc], [{"f": {p: [v] for p, v in args.items()}}])

    def listed(asked, donors=(), seed=0, too_long=lambda q: False, most_calls=4):
        return multi_value([asked], [asked, *donors], 1, seed, too_long, most_calls=most_calls)

    city = question("a", "The weather in 'Paris, France' please", {"city": "Paris, France"})
    donors = [question("b", "x", {"city": "Rome, Italy"}), question("c", "y", {"city": "Oslo, Norway"})]
    row = next(r for seed in range(20) for r in listed(city, donors, seed=seed) if len(r.ground_truth) == 3)
    assert row.messages[0]["content"] in {f"The weather in 'Paris, France'; '{a}' and '{b}' please"
                                          for a, b in [("Rome, Italy", "Oslo, Norway"), ("Oslo, Norway", "Rome, Italy")]}
    assert row.id == "values_a" and row.category == "synthetic_parallel_values"
    assert [call["f"]["city"] for call in row.ground_truth][0] == ["Paris, France"]
    unit = question("d", "Give it in celsius now", {"unit": "celsius"}, {"unit": {"type": "string", "enum": ["celsius", "kelvin"]}})
    assert [r.messages[0]["content"] for r in listed(unit)] == ["Give it in celsius and kelvin now"]
    assert [r.ground_truth for r in listed(unit)] == [[{"f": {"unit": ["celsius"]}}, {"f": {"unit": ["kelvin"]}}]]
    numbers = {len(r.ground_truth): r for seed in range(20) for r in listed(question("e", "Volume to 30 %", {"v": 30}), seed=seed)}
    assert set(numbers) == {2, 3, 4}
    for r in numbers.values():
        values = [call["f"]["v"][0] for call in r.ground_truth]
        assert all(type(v) is int and 15 <= v <= 63 for v in values) and len(set(values)) == len(values)
    floats = listed(question("f", "Scale by 1.5 then", {"s": 1.5}), seed=3)[0].ground_truth
    assert all(type(c["f"]["s"][0]) is float and len(str(c["f"]["s"][0]).partition(".")[2]) <= 1 for c in floats)
    assert listed(question("g", "Paris or Paris?", {"city": "Paris"}), [question("h", "x", {"city": "Rome"})]) == []  # written twice
    assert listed(question("i", "Set it to 150", {"v": 15})) == []  # inside a longer number
    assert listed(question("j", "Turn it on: True", {"on": True})) == []  # a bool
    assert listed(question("k", "Call Alice now", {"name": "Alice"})) == []  # no other name to list
    short = listed(question("l", "Volume to 30 %", {"v": 30}), seed=5, too_long=lambda q: len(q.ground_truth) > 2)
    assert [len(r.ground_truth) for r in short] == [2]
    assert listed(question("m", "Volume to 30 %", {"v": 30}), too_long=lambda q: True) == []


def test_values_from_chooses_the_questions_multi_value_asks(tmp_path, capsys):
    """values_from=live_simple,live_multiple asks live_multiple questions too (keeping all their functions), more rows
    than live_simple alone; a category it cannot ask is refused with the ones it can."""
    made = {}
    for kinds in ("live_simple", "live_simple,live_multiple"):
        out = tmp_path / kinds.replace(",", "_")
        assert main(["prepare", "bfcl", "--out", str(out), "limit=80", "sft_val_size=30", "multi_value=80", f"values_from={kinds}",
                     "multi_turn="]) == 0
        made[kinds] = {r["extra_info"]["id"]: r for r in _rows(out / "train.parquet") if r["extra_info"]["category"] == "synthetic_parallel_values"}
    simple, both = made.values()
    assert {i.split("_")[2] for i in simple} == {"simple"} and {i.split("_")[2] for i in both} == {"simple", "multiple"}
    assert set(simple) <= set(both) and len(both) > len(simple)
    questions = {q.id: q for q in load_category("live_multiple", 80)}
    for qid, row in both.items():
        if "multiple" in qid:
            assert json.loads(row["extra_info"]["bfcl_functions"]) == questions[qid.removeprefix("values_")].functions
    capsys.readouterr()
    with pytest.raises(InputError, match="values_from='live_parallel'.*live_simple, live_multiple"):
        prepare("bfcl", tmp_path / "bad", limit=2, values_from="live_parallel")


def test_multi_value_lists_no_value_the_checker_reads_as_another_and_no_argument_another_one_holds():
    """No listed value that BFCL's checker reads as one already listed or as one of the question's own accepted values
    ("Austin, TX" and "austin tx"); no value outside the parameter's enum; other values from the same function's same
    parameter only; no argument whose value another argument also holds (an end date equal to the start date); no number
    inside a list of numbers, a time or after a minus sign; none inside a longer quoted phrase; none holding " and " (the list
    would not say where it ends); a negative number gets negative neighbours."""
    from posttrain.data.preparers.bfcl import Question
    from posttrain.data.preparers.bfcl_added import multi_value

    def question(qid, text, args, properties=None, name="f"):
        doc = {"name": name, "parameters": {"type": "dict", "properties": properties or {}}}
        return Question(qid, "live_simple", [{"role": "user", "content": text}], [doc], [{name: {p: v if isinstance(v, list) else [v]
                                                                                                  for p, v in args.items()}}])

    def listed(asked, donors=(), seeds=range(8)):
        return [r for seed in seeds for r in multi_value([asked], [asked, *donors], 1, seed, lambda q: False, most_calls=4)]

    def values(row, param):
        return [call["f"][param][0] for call in row.ground_truth]

    austin = question("a", "Weather in Austin, Texas now", {"city": ["Austin, Texas", "Austin, TX"]})
    donors = [question("b", "x", {"city": "austin tx"}), question("c", "x", {"city": "AUSTIN, TEXAS"}), question("d", "x", {"city": "Rome, Italy"}),
              question("e", "x", {"town": "Oslo, Norway"}), question("f", "x", {"city": "Paris, France"}, name="g")]
    rows = listed(austin, donors)
    assert rows and all(values(r, "city")[1:] == ["Rome, Italy"] for r in rows)  # the others read as Austin, or are another parameter's or function's
    genre = {"genre": {"type": "string", "enum": ["Horror", "Comedy"]}}
    rows = listed(question("h", "A Horror film", {"genre": "Horror"}, genre), [question("i", "x", {"genre": "horror"}), question("j", "x", {"genre": "Reggaeton"})])
    assert rows and all(values(r, "genre") == ["Horror", "Comedy"] for r in rows)
    dates = question("k", "Rent a car on 2023-04-12 for the day", {"start": "2023-04-12", "end": "2023-04-12"})
    assert listed(dates, [question("l", "x", {"start": "2023-05-01"})]) == []
    url = question("m", "The fabric PEK-ACI, please", {"fabricName": "PEK-ACI", "url": "http://x/?fabricName=PEK-ACI"})
    assert listed(url, [question("n", "x", {"fabricName": "LAX-ACI"})]) == []
    for text in ("Move it to 2,3,4 now", "Meet at 2:30 PM", "It is -2 outside"):
        assert listed(question("o", text, {"v": 2})) == [], text
    phrase = question("p", "Search 'history of kites and more' please", {"q": "kites"})
    assert listed(phrase, [question("q", "x", {"q": "boats"})]) == []
    assert listed(question("r", "Search for kites and planes today", {"q": "kites and planes"}), [question("s", "x", {"q": "boats"})]) == []
    (row,) = listed(question("r", "Search for kites today", {"q": "kites"}), [question("s", "x", {"q": "boats and planes"}),
                                                                              question("u", "x", {"q": "cars"})], seeds=[0])
    assert values(row, "q") == ["kites", "cars"]
    cold = listed(question("t", "Cool it to -10 degrees", {"t": -10}))
    assert cold and all(v < 0 for row in cold for v in values(row, "t"))


def _asked(text: str, calls: list[dict]) -> Question:
    return Question("q", "live_simple", [{"role": "user", "content": text}], [], calls)


def test_joins_values_finds_two_arguments_values_joined_by_and():
    """The shape multi_value's rows list one argument's values in, said of two arguments: "and" between two arguments'
    values, within 40 characters and one sentence, in a one-call question."""
    triangle = [{"area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    assert joins_values(_asked("Find the area of a triangle with a base of 10 units and height of 5 units.", triangle))
    chimp = [{"similarity": {"species1": ["Human"], "species2": ["Chimpanzee", "chimp"]}}]  # any case, any accepted value
    assert joins_values(_asked("How similar are a Human and a chimp?", chimp))
    assert not joins_values(_asked("A triangle with a base of 10 units. And its height is 5 units.", triangle))  # two sentences
    assert not joins_values(_asked("A base of 10, and please remember that the height of the triangle is 5 units.", triangle))  # far
    assert not joins_values(_asked("A base of 10 or a height of 5.", triangle))  # no "and"
    assert not joins_values(_asked("Circles of radius 3 and 5.", [{"area": {"radius": [3]}}]))  # one argument's value
    assert not joins_values(_asked("A base of 10 and height of 5.", triangle * 2))  # two calls


def test_joined_values_names_the_one_call_rows_that_join_two_arguments_values(tmp_path, capsys):
    """joined_values=true: those training rows take their category with "_joined" (the checker's rule unchanged, their
    transcripts still right); every row is otherwise the same, in the same order, the added rows too; held-out rows keep theirs."""
    options = dict(limit=120, sft_val_size=8, multi_turn="", multi_value=20)
    assert main(["prepare", "bfcl", "--out", str(tmp_path), "joined_values=true", *(f"{k}={v}" for k, v in options.items())]) == 0
    assert re.search(r"joined_values: [1-9]\d* train rows take a category of their own \(of the above: live_multiple_joined [1-9]",
                     capsys.readouterr().out)
    plain = tmp_path / "plain"
    prepare("bfcl", plain, **options)
    joined, before = _rows(tmp_path / "train.parquet"), _rows(plain / "train.parquet")
    renamed = [(a, b) for a, b in zip(joined, before) if a != b]
    assert len(joined) == len(before) and {a["extra_info"]["category"] for a, _ in renamed} == {"live_simple_joined", "live_multiple_joined"}
    for a, b in renamed:
        assert a["extra_info"]["category"] == b["extra_info"]["category"] + "_joined"
        assert {k: v for k, v in a["extra_info"].items() if k != "category"} == {k: v for k, v in b["extra_info"].items() if k != "category"}
        assert a | {"extra_info": b["extra_info"]} == b
        question = Question("q", a["extra_info"]["category"], a["prompt"], json.loads(a["extra_info"]["bfcl_functions"]),
                            json.loads(a["reward_model"]["ground_truth"]))
        right = bfcl.answer_calls(question.ground_truth, question.functions)
        assert joins_values(question) and bfcl.check_calls(right, question.ground_truth, a["extra_info"]).valid
        twice = [bfcl.check_calls(right * 2, question.ground_truth, row["extra_info"]) for row in (a, b)]  # the rule, by its verdict
        assert not twice[0].valid and twice[0].error_type == twice[1].error_type
    for row in before:  # every one-call row of the shape is renamed, no other
        question = Question("q", row["extra_info"]["category"], row["prompt"], [], json.loads(row["reward_model"]["ground_truth"]))
        assert (row["extra_info"]["id"] in {b["extra_info"]["id"] for _, b in renamed}) is (
            joins_values(question) and row["extra_info"]["category"] in ("live_simple", "live_multiple"))
    assert any(r["extra_info"]["category"] == "synthetic_parallel_values" for r in joined)  # the added rows, the same with it or without
    assert _rows(tmp_path / "sft.parquet") != _rows(plain / "sft.parquet")  # the transcripts carry the category, nothing else changes
    assert [r["messages"] for r in _rows(tmp_path / "sft.parquet")] == [r["messages"] for r in _rows(plain / "sft.parquet")]
    assert _rows(tmp_path / "test.parquet") == _rows(plain / "test.parquet")
    capsys.readouterr()
    prepare("bfcl", tmp_path / "none", limit=3, sft_val_size=1, multi_turn="", train_categories="live_irrelevance", joined_values=True)
    assert "joined_values: 0 train rows take a category of their own (of the above: none)" in capsys.readouterr().out
