"""The retriever's corpus and indexes, in process: corpus loading and its errors, BM25 (ranking, the
Lucene formula by hand, empty queries, topk), dense ranking and its cache, and bm25s kept from numba."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from posttrain.agents.retriever import BM25Index, CorpusError, DenseIndex, Document, build_index, load_corpus
from tests.agents.retriever_helpers import DOCUMENTS


# --- corpus -------------------------------------------------------------------------------------

def test_load_corpus_reads_ids_as_strings_and_skips_blank_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 7, "contents": "\\"Title\\"\\nsome text"}\n\n   \n{"id": "x", "contents": "plain"}\n')
    documents = load_corpus(path)
    assert documents == [Document("7", '"Title"\nsome text'), Document("x", "plain")]
    assert (documents[0].title, documents[0].text) == ("Title", "some text")


@pytest.mark.parametrize("bad_line, problem", [
    ("{not json", "not valid JSON"),
    ('{"id": 2}', '"contents" is missing or empty'),
    ('{"id": 2, "contents": "  "}', '"contents" is missing or empty'),
    ('{"contents": "text"}', '"id" is missing'),
    ('["a list"]', "not a JSON object (a list)"),
    ('{"id": 1, "contents": "again"}', "duplicate id '1' (first on line 1)"),
])
def test_each_kind_of_bad_line_is_named_with_its_line_number(tmp_path, bad_line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "contents": "fine"}\n\n' + bad_line + "\n")
    with pytest.raises(CorpusError) as caught:
        load_corpus(path)
    message = str(caught.value)
    assert str(path) in message and f"line 3: {problem}" in message
    assert '{"id": "0", "contents":' in message  # what a valid line looks like


def test_many_bad_lines_name_the_first_five_and_count_the_rest(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join("oops\n" for _ in range(8)))
    message = str(pytest.raises(CorpusError, load_corpus, path).value)
    assert "8 bad line(s)" in message and "line 5:" in message and "line 6:" not in message and "3 more" in message


def test_an_empty_or_missing_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(CorpusError, match="no documents"):
        load_corpus(tmp_path / "empty.jsonl")
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "missing.jsonl")


# --- BM25 ---------------------------------------------------------------------------------------

def test_bm25_ranks_the_document_with_the_rare_word_first_and_returns_only_matches():
    index = BM25Index(DOCUMENTS)
    [penguin], [aspirin_pain] = index.search(["flightless bird"], 3), index.search(["aspirin pain"], 3)
    assert [hit.document.id for hit in penguin] == ["2"]
    # "aspirin" is only in doc 0, "pain" is in docs 0 and 3; no other document shares a term.
    assert [hit.document.id for hit in aspirin_pain] == ["0", "3"]
    assert aspirin_pain[0].score > aspirin_pain[1].score > 0


def test_bm25_scores_match_the_lucene_formula_by_hand():
    # Equal-length documents (3 terms each), so the length norm is 1 and a term seen once scores
    # idf * 1 / (1 + k1) with idf = ln(1 + (N - df + 0.5) / (df + 0.5)), N = 4, k1 = 1.5.
    documents = [Document(str(i), text) for i, text in enumerate(["alpha beta gamma", "delta epsilon zeta",
                                                                    "alpha theta omega", "iota kappa lambda"])]
    index = BM25Index(documents)
    [[delta]], [alpha] = index.search(["delta"], 2), index.search(["alpha"], 4)
    assert delta.document.id == "1" and delta.score == pytest.approx(math.log(1 + 3.5 / 1.5) / 2.5, rel=1e-5)
    assert sorted(hit.document.id for hit in alpha) == ["0", "2"]
    assert [hit.score for hit in alpha] == pytest.approx([math.log(2.0) / 2.5] * 2, rel=1e-5)


def test_bm25_empty_unknown_and_stopword_queries_get_no_hits_in_their_place():
    hits = BM25Index(DOCUMENTS).search(["", "   ", "xylophone quasar", "the of and", "jazz"], 3)
    assert hits[:4] == [[], [], [], []]
    assert [hit.document.id for hit in hits[4]] == ["4"]


def test_topk_is_capped_at_the_corpus_size_and_must_be_positive():
    index = BM25Index(DOCUMENTS)
    [hits] = index.search(["is a the medicine volcano penguin jazz aspirin"], 100)
    assert sorted(hit.document.id for hit in hits) == ["0", "1", "2", "3", "4"]
    with pytest.raises(ValueError, match="topk"):
        index.search(["jazz"], 0)


def test_build_index_names_the_choices_for_an_unknown_kind():
    assert isinstance(build_index("bm25", DOCUMENTS), BM25Index)
    with pytest.raises(ValueError, match="bm25, dense"):
        build_index("splade", DOCUMENTS)


# --- dense --------------------------------------------------------------------------------------

def test_dense_finds_the_document_a_paraphrase_means(dense_cache):
    index = build_index("dense", DOCUMENTS, cache_dir=dense_cache)
    bird, fever, blank = index.search(["Which bird cannot fly?", "a pill that brings down a temperature", " "], 2)
    assert bird[0].document.id == "2" and fever[0].document.id == "0" and blank == []
    assert len(bird) == 2 and 1.0 >= bird[0].score > bird[1].score  # cosine similarities, best first


def test_dense_index_is_cached_and_a_second_build_does_not_encode(dense_cache, monkeypatch):
    first = DenseIndex(DOCUMENTS, cache_dir=dense_cache / "fresh")
    assert not first.loaded_from_cache and first.cache_path.is_file()
    assert first.cache_path.parent.parent == dense_cache / "fresh" and len(first.cache_path.parent.name) == 16
    assert not list(first.cache_path.parent.glob("*.tmp"))  # written atomically, no temp file left

    def no_encoding(self):
        raise AssertionError("the cached index must be loaded, not rebuilt")

    monkeypatch.setattr(DenseIndex, "_encode_documents", no_encoding)
    second = DenseIndex(DOCUMENTS, cache_dir=dense_cache / "fresh")
    assert second.loaded_from_cache and second.cache_path == first.cache_path
    assert second.search(["volcano lava"], 3) == first.search(["volcano lava"], 3)


def test_a_different_corpus_gets_a_different_cache_entry(dense_cache):
    from posttrain.agents.retriever.index import dense_cache_path

    assert dense_cache_path(DOCUMENTS, dense_cache) != dense_cache_path(DOCUMENTS[:4], dense_cache)
    assert dense_cache_path(DOCUMENTS, dense_cache) == dense_cache_path(list(DOCUMENTS), dense_cache)


def test_bm25_leaves_numba_unimported():
    """bm25s imports numba when it can; numba in the process breaks a vLLM engine created after it."""
    code = (
        "import sys\nfrom posttrain.agents.retriever import Document, build_index\n"
        "build_index('bm25', [Document('1', 'apple pie'), Document('2', 'plum jam')]).search(['apple'], 1)\n"
        "assert 'bm25s' in sys.modules and 'numba' not in sys.modules, sorted(m for m in sys.modules if 'numba' in m)[:3]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
