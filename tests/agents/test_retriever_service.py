"""The real retriever service, started as `posttrain serve-retriever` (RetrieverProcess): its HTTP API
in Search-R1's shape, BM25 scores a person can recompute, malformed requests, the dense service, and a
process that dies at startup."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import httpx
import pytest

from posttrain.agents.retriever import RetrieverClient, RetrieverError, RetrieverProcess
from posttrain.errors import is_restartable
from tests.agents.retriever_helpers import DOCUMENTS, FLIGHTLESS_BIRD, K1, NORM_7, post


def test_health_reports_the_documents_and_the_index_kind(bm25_url):
    assert httpx.get(f"{bm25_url}/health").json() == {"status": "ok", "documents": 5, "index": "bm25"}


def test_retrieve_answers_in_search_r1_shape(bm25_url):
    response = post(bm25_url, {"queries": ["flightless bird", "disease pain medicine"], "topk": 3})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    for hits in body["result"]:
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
            assert isinstance(hit["document"]["id"], str) and isinstance(hit["score"], float)
        assert [hit["score"] for hit in hits] == sorted((hit["score"] for hit in hits), reverse=True)
    penguin = {"document": {"id": "2", "contents": DOCUMENTS[2].contents}, "score": pytest.approx(FLIGHTLESS_BIRD, rel=1e-5)}
    assert body["result"][0] == [penguin]
    # Document 3 has "disease" (only there: idf ln 4), "pain" once and "medicine" twice (each in 2
    # documents: idf ln 2.4); document 0 has "pain" and "medicine" once each. Both are 7 terms long.
    one, twice = 1 / (1 + K1 * NORM_7), 2 / (2 + K1 * NORM_7)
    assert [(hit["document"]["id"], hit["score"]) for hit in body["result"][1]] == [
        ("3", pytest.approx(math.log(4) * one + math.log(2.4) * one + math.log(2.4) * twice, rel=1e-5)),  # 1.4209
        ("0", pytest.approx(2 * math.log(2.4) * one, rel=1e-5)),  # 0.7092
    ]


def test_topk_is_respected_and_defaults_to_three(bm25_url):
    query = "medicine pain volcano penguin jazz"  # shares a term with every document
    [one] = post(bm25_url, {"queries": [query], "topk": 1}).json()["result"]
    [default] = post(bm25_url, {"queries": [query]}).json()["result"]
    assert len(one) == 1 and len(default) == 3 and default[0] == one[0]


def test_without_scores_each_hit_is_the_bare_document(bm25_url):
    response = post(bm25_url, {"queries": ["jazz", "xylophone"], "return_scores": False})
    assert response.json() == {"result": [[{"id": "4", "contents": DOCUMENTS[4].contents}], []]}


@pytest.mark.parametrize("body", [
    {"topk": 3},
    {"queries": ["jazz"], "topk": 0},
    {"queries": ["jazz"], "topk": 101},
    {"queries": "jazz"},
    {"queries": [3]},
    {"queries": []},
    {"queries": ["jazz"] * 1025},
    b'{"queries": ["jazz"',
], ids=["no-queries", "topk-0", "topk-101", "queries-not-a-list", "query-not-a-string", "empty-list", "1025-queries", "invalid-json"])
def test_malformed_requests_get_422_and_the_service_keeps_serving(bm25_url, body):
    response = post(bm25_url, body)
    assert response.status_code == 422 and response.json()["detail"]
    assert post(bm25_url, {"queries": ["jazz"]}).json()["result"][0][0]["document"]["id"] == "4"


def test_the_dense_service_serves_and_caches_its_index(corpus_file, tmp_path):
    with RetrieverProcess(corpus_file, "dense", cache_dir=tmp_path, startup_timeout_s=120) as service:
        with RetrieverClient(service.url) as client:
            assert client.health() == {"status": "ok", "documents": 5, "index": "dense"}
            [hits] = client.retrieve(["Which bird cannot fly?"], 3)
    assert hits[0].document == DOCUMENTS[2] and len(hits) == 3
    assert len(list(tmp_path.glob("*/index.faiss"))) == 1


def test_a_process_that_dies_at_startup_raises_with_its_log_and_keeps_it_and_a_clean_stop_leaves_no_log(tmp_path, corpus_file):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("oops\n")
    with pytest.raises(RetrieverError, match="exited with code 2") as caught:
        RetrieverProcess(bad, "bm25", startup_timeout_s=60)
    assert "line 1: not valid JSON" in str(caught.value)
    kept = Path(re.search(r"the end of its log (\S+retriever\.log)", str(caught.value)).group(1))
    assert "not valid JSON" in kept.read_text()  # the log the error names is there to read
    shutil.rmtree(kept.parent)
    with RetrieverProcess(corpus_file, "bm25", startup_timeout_s=60) as service:
        log = service.log_path
        assert log.exists()
    assert not log.parent.exists()  # a clean stop removes its temporary log directory


def test_a_started_retriever_that_exits_mid_run_is_a_restartable_failure(corpus_file):
    """The retriever a run started for itself, killed: the next whole batch is not trained on its
    failed searches; the run gets ServiceDiedError (restartable: trainer.max_restarts starts it again)."""
    import os
    import signal

    from posttrain.config.schema import RetrieverConfig
    from posttrain.errors import ServiceDiedError
    from posttrain.rollout.retriever import open_retriever

    handle = open_retriever(RetrieverConfig(corpus=str(corpus_file), startup_timeout_s=60), None)
    try:
        handle.check_alive()  # serving: nothing to say
        os.kill(handle.process._process.pid, signal.SIGKILL)
        handle.process._process.wait(timeout=10)
        with pytest.raises(ServiceDiedError, match=r"the retriever the run started \(http://127\.0\.0\.1:\d+\) exited with code -9") as info:
            handle.check_alive()
        assert is_restartable(info.value)
    finally:
        handle.close()
    handle.check_alive()  # stopped by the run itself: not a failure
