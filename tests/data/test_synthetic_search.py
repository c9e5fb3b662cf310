"""The synthetic-search preparer: deterministic files, answers found in the corpus, disjoint splits."""

import json

import pytest

from posttrain.cli import main
from posttrain.data import parse_options, prepare, read_rows
from posttrain.data.preparers.synthetic_search import CORPUS_FILE, build_world, document_text, search_instruction

SMALL = dict(num_people=40, num_places=12, num_organisations=8, train_size=120, val_size=30, two_hop_fraction=0.4, seed=3)


def _corpus(out_dir) -> dict[str, str]:
    """Title -> document text, read back from corpus.jsonl."""
    docs = [json.loads(line) for line in (out_dir / CORPUS_FILE).read_text(encoding="utf-8").splitlines()]
    assert [d["id"] for d in docs] == [str(i) for i in range(len(docs))]
    titles = {}
    for doc in docs:
        title, _, text = doc["contents"].partition("\n")
        assert title.startswith('"') and title.endswith('"') and text
        titles[title.strip('"')] = text
    return titles


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("search")
    train, test = prepare("synthetic-search", out_dir, **SMALL)
    return out_dir, read_rows([train]), read_rows([test])


def test_same_arguments_give_byte_identical_files(tmp_path):
    prepare("synthetic-search", tmp_path / "a", **SMALL)
    prepare("synthetic-search", tmp_path / "b", **SMALL)
    prepare("synthetic-search", tmp_path / "c", **(SMALL | {"seed": 4}))
    for name in ("train.parquet", "test.parquet", CORPUS_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_corpus_has_one_document_per_entity_with_unique_names(prepared):
    out_dir, _, _ = prepared
    corpus = _corpus(out_dir)
    assert len(corpus) == 40 + 12 + 8  # titles are unique, one per entity
    world = build_world(40, 12, 8, seed=3)
    words = [word.lower() for e in world.entities for word in e.name.split() if word not in ("Works", "Group", "Guild", "Company", "Trust", "Institute")]
    assert len(words) == len(set(words))  # no word of a name is reused, let alone a name
    for entity in world.entities:
        assert all(value in corpus[entity.name] for value in entity.facts.values())  # every fact is stated


def test_document_by_hand():
    world = build_world(3, 2, 1, seed=0)
    person = world.entities[0]
    f = person.facts
    article = "an" if f["occupation"] in ("engineer", "architect", "astronomer") else "a"
    assert document_text(person) == (
        f'"{person.name}"\n{person.name} is {article} {f["occupation"]} born in {f["birth_year"]} in {f["birthplace"]}. '
        f'{person.name} works for {f["employer"]}.'
    )
    assert world.entity(f["birthplace"]).kind == "city" and world.entity(f["employer"]).kind == "organisation"


def test_every_answer_is_in_the_documents_of_the_entities_involved(prepared):
    out_dir, train, test = prepared
    corpus = _corpus(out_dir)
    for row in train + test:
        info, targets = row.extra_info, row.ground_truth["target"]
        subject_doc = corpus[info["subject"]]
        assert info["subject"] in info["question"] and row.messages[0]["content"] == search_instruction(info["question"])
        if info["hops"] == 1:
            assert info["bridge"] == "" and "." not in info["relation"]
            assert targets[0] in subject_doc
        else:
            # the subject's document names the bridge, whose document holds the answer
            assert info["hops"] == 2 and info["bridge"] in subject_doc and "." in info["relation"]
            assert targets[0] in corpus[info["bridge"]]
        assert all(target in corpus[info["bridge"] or info["subject"]] for target in targets)


def test_answers_are_the_facts_of_the_world(prepared):
    _, train, test = prepared
    world = build_world(40, 12, 8, seed=3)
    for row in train + test:
        info = row.extra_info
        entity = world.entity(info["subject"])
        *links, attribute = info["relation"].split(".")
        for link in links:  # one link for a two-hop question
            assert entity.facts[link] == info["bridge"]
            entity = world.entity(entity.facts[link])
        assert row.ground_truth["target"][0] == entity.facts[attribute]


def test_rivers_answer_with_an_alias(prepared):
    _, train, test = prepared
    rivers = [r for r in train + test if r.extra_info["relation"].endswith("river")]
    assert rivers
    for row in rivers:
        answer, alias = row.ground_truth["target"]
        assert alias == f"{answer} River"


def test_splits_never_share_an_entity_relation_pair(prepared):
    _, train, test = prepared
    assert len(train) == 120 and len(test) == 30
    train_pairs = {(r.extra_info["subject"], r.extra_info["relation"]) for r in train}
    test_pairs = {(r.extra_info["subject"], r.extra_info["relation"]) for r in test}
    assert len(train_pairs) == 120 and len(test_pairs) == 30  # no repeats within a split either
    assert not train_pairs & test_pairs
    assert [r.extra_info["index"] for r in train] == list(range(120))
    assert {r.extra_info["split"] for r in train} == {"train"} and {r.extra_info["split"] for r in test} == {"test"}


def test_two_hop_fraction_is_respected(prepared, tmp_path):
    _, train, test = prepared
    assert sum(r.extra_info["hops"] == 2 for r in train) == 48  # 0.4 * 120
    assert sum(r.extra_info["hops"] == 2 for r in test) == 12  # 0.4 * 30
    for fraction, expected in ((0.0, 0), (1.0, 30)):
        _, only_test = prepare("synthetic-search", tmp_path / str(fraction), **(SMALL | {"two_hop_fraction": fraction}))
        assert sum(r.extra_info["hops"] == 2 for r in read_rows([only_test])) == expected


def test_rows_are_in_verl_format(prepared):
    _, train, _ = prepared
    row = train[0]
    assert row.data_source == "synthetic_search" and row.ability == "fact-reasoning"
    assert [m["role"] for m in row.messages] == ["user"]
    assert set(row.ground_truth) == {"target"} and all(isinstance(t, str) and t for t in row.ground_truth["target"])
    assert set(row.extra_info) == {"split", "index", "question", "hops", "relation", "subject", "bridge"}
    prompt = row.messages[0]["content"]
    assert "between <search> and </search>" in prompt and "<information>" in prompt and "<answer>" in prompt
    assert prompt.endswith(f"Question: {row.extra_info['question']}\n")


def test_bad_options_say_the_limit_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="train_size=0: must be at least 1"):
        prepare("synthetic-search", tmp_path, train_size=0)
    with pytest.raises(ValueError, match="num_people=-1: must be at least 1"):
        prepare("synthetic-search", tmp_path, num_people=-1)
    with pytest.raises(ValueError, match=r"two_hop_fraction=1.5: must lie in \[0, 1\]"):
        prepare("synthetic-search", tmp_path, two_hop_fraction=1.5)
    # 2 people, 1 city, 1 organisation: 2*4 + 3 + 4 = 15 single-hop and 2*4 + 3 = 11 two-hop questions
    tiny = dict(num_people=2, num_places=1, num_organisations=1)
    with pytest.raises(ValueError, match="asked for 16 single-hop questions but a world of 2 people.*supplies only 15; lower train_size"):
        prepare("synthetic-search", tmp_path, train_size=10, val_size=6, two_hop_fraction=0.0, **tiny)
    with pytest.raises(ValueError, match="asked for 12 two-hop questions.*supplies only 11"):
        prepare("synthetic-search", tmp_path, train_size=10, val_size=2, two_hop_fraction=1.0, **tiny)
    train, test = prepare("synthetic-search", tmp_path, train_size=10, val_size=1, two_hop_fraction=1.0, **tiny)
    assert len(read_rows([train, test])) == 11  # the whole two-hop supply, without repeats


def test_cli_writes_the_three_files(tmp_path, capsys):
    assert parse_options("synthetic-search", ["two_hop_fraction=0.25", "num_people=9"]) == {"two_hop_fraction": 0.25, "num_people": 9}
    assert main(["prepare", "synthetic-search", "--out", str(tmp_path), "train_size=20", "val_size=5"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [CORPUS_FILE, "test.parquet", "train.parquet"]
    assert len(read_rows([tmp_path / "train.parquet"])) == 20 and len(read_rows([tmp_path / "test.parquet"])) == 5
    assert str(tmp_path / "train.parquet") in capsys.readouterr().out


def _question(messages) -> str:
    return messages[0]["content"].split("Question: ", 1)[1].strip()


def test_expert_transcripts_use_train_questions_and_the_real_environment(tmp_path):
    from posttrain.agents.env import EpisodeSample
    from posttrain.agents.retriever.corpus import load_corpus
    from posttrain.agents.retriever.index import BM25Index
    from posttrain.agents.search import SearchEnv

    import pyarrow.parquet as pq

    paths = prepare("synthetic-search", tmp_path, **(SMALL | {"sft_size": 20, "sft_val_size": 6, "sft_two_hop_fraction": 0.5}))
    assert [p.name for p in paths] == ["train.parquet", "test.parquet", "sft.parquet", "sft_val.parquet"]
    train, test = read_rows([tmp_path / "train.parquet"]), read_rows([tmp_path / "test.parquet"])
    sft = [r["messages"] for r in pq.read_table(tmp_path / "sft.parquet").to_pylist()]
    sft_val = [r["messages"] for r in pq.read_table(tmp_path / "sft_val.parquet").to_pylist()]
    assert (len(sft), len(sft_val)) == (20, 6)
    asked = [_question(m) for m in sft + sft_val]
    assert len(set(asked)) == len(asked)
    assert not set(asked) & {r.extra_info["question"] for r in test}  # held-out questions never appear
    by_question = {r.extra_info["question"]: r for r in train}
    assert set(asked) <= set(by_question)
    assert sum(len(m) == 6 for m in sft) == 10  # two searches, two observations, an answer: half are two-hop
    # replaying each transcript's actions in a fresh SearchEnv over the corpus gives its observations exactly
    index = BM25Index(load_corpus(tmp_path / CORPUS_FILE))
    retriever = type("R", (), {"retrieve": lambda self, queries, topk: index.search(queries, topk)})()
    for messages in sft:
        row = by_question[_question(messages)]
        env = SearchEnv(retriever, topk=2)
        env.reset(EpisodeSample(messages[:1], row.ground_truth))
        assert messages[0]["content"] == row.messages[0]["content"]
        for i in range(1, len(messages) - 1, 2):
            assert env.step(messages[i]["content"]).observation == messages[i + 1]["content"]
        final = env.step(messages[-1]["content"])
        assert final.done and final.info.success
        assert len(messages) == 2 * row.extra_info["hops"] + 2


def test_no_validation_transcripts_and_no_stale_ones(tmp_path):
    prepare("synthetic-search", tmp_path, **(SMALL | {"sft_size": 6, "sft_val_size": 2}))
    assert (tmp_path / "sft_val.parquet").is_file()
    paths = prepare("synthetic-search", tmp_path, **(SMALL | {"sft_size": 6, "sft_val_size": 0}))
    assert [p.name for p in paths][2:] == ["sft.parquet"] and not (tmp_path / "sft_val.parquet").exists()
    prepare("synthetic-search", tmp_path, **SMALL)
    assert not (tmp_path / "sft.parquet").exists()


def test_tool_format_transcripts_show_what_the_search_tool_returns(tmp_path, monkeypatch):
    """With tool_format, each expert turn is a call of the built-in search tool and each observation is
    that tool's own result, run by the toolbox against the real retriever service over the corpus."""
    import pyarrow.parquet as pq

    from posttrain.agents.retriever import RetrieverProcess
    from posttrain.data.preparers.synthetic_search import tool_instruction
    from posttrain.models.tool_formats.builtin import tool_responses
    from posttrain.rewards.search_answer import compute_score
    from posttrain.tools import ParsedCall, ToolBox, load_tools
    from posttrain.tools.builtin import RETRIEVER_URL_VAR

    prepare("synthetic-search", tmp_path, **(SMALL | {"sft_size": 8, "sft_val_size": 2, "sft_two_hop_fraction": 0.5, "tool_format": True}))
    train = {r.extra_info["question"]: r for r in read_rows([tmp_path / "train.parquet"])}
    sft = [r["messages"] for r in pq.read_table(tmp_path / "sft.parquet").to_pylist()]
    assert len(sft) == 8 and sum(len(m) == 6 for m in sft) == 4  # two calls, two results, an answer: half two-hop
    with RetrieverProcess(tmp_path / CORPUS_FILE, "bm25", startup_timeout_s=60) as service:
        monkeypatch.setenv(RETRIEVER_URL_VAR, service.url)
        box = ToolBox(load_tools(["posttrain.tools:search"]))  # its child process inherits the address
        try:
            for messages in sft:
                row = train[_question(messages)]
                assert messages[0]["content"] == row.messages[0]["content"] == tool_instruction(row.extra_info["question"])
                queries = [row.extra_info["subject"], row.extra_info["bridge"]][: row.extra_info["hops"]]
                for i, query in enumerate(queries):
                    call, shown = messages[1 + 2 * i]["content"], messages[2 + 2 * i]["content"]
                    assert call.startswith("<tool_call>\n") and call.endswith("\n</tool_call>")
                    assert json.loads(call.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) == {"name": "search", "arguments": {"query": query}}
                    (result,) = box.run([ParsedCall("search", json.dumps({"query": query}))])
                    assert result.ok and shown == tool_responses([("search", result.text)])
                assert compute_score(messages[-1]["content"], row.ground_truth)["score"] == 1.0
        finally:
            box.close()
