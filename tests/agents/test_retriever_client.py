"""The retriever client: against the real service (its answers as Hits, the Search-R1 URL, requests
split at the service's limit), and its failures against a service in a thread (retries of a 500,
no retry of a 4xx, timeouts, a service that is down)."""

from __future__ import annotations

import time

import pytest

from posttrain.agents.retriever import Hit, RetrieverClient, RetrieverError
from posttrain.agents.retriever.process import free_port
from tests.agents.retriever_helpers import DOCUMENTS, FLIGHTLESS_BIRD, FlakyIndex


def test_the_client_against_the_real_service(bm25_url):
    with RetrieverClient(bm25_url) as client:
        assert client.health() == {"status": "ok", "documents": 5, "index": "bm25"}
        penguin, blank = client.retrieve(["flightless bird", ""], 2)
        assert penguin == [Hit(DOCUMENTS[2], pytest.approx(FLIGHTLESS_BIRD, rel=1e-5))] and blank == []
        assert client.retrieve([], 3) == []
    with RetrieverClient(f"{bm25_url}/retrieve/") as client:  # as Search-R1 configs write the URL
        assert client.retrieve(["jazz"], 1)[0][0].document == DOCUMENTS[4]


def test_more_queries_than_one_request_holds_are_split(bm25_url):
    from posttrain.agents.retriever.types import MAX_QUERIES

    queries = ["jazz"] * (MAX_QUERIES + 5)
    with RetrieverClient(bm25_url) as client:
        hits = client.retrieve(queries, 1)
        assert len(hits) == len(queries) and hits[0] == hits[-1]
        with pytest.raises(RetrieverError, match="topk=101"):
            client.retrieve(["jazz"], 101)


# --- client failures, against a service in a thread ---------------------------------------------

def test_a_500_is_retried_and_the_next_answer_is_used(threaded_service):
    start, seen = threaded_service
    index = FlakyIndex(failures=1)
    with RetrieverClient(start(index), retries=2, backoff_s=0.01) as client:
        assert client.retrieve(["q1", "q2"], 3) == [[Hit(DOCUMENTS[0], 1.0)]] * 2
    assert seen == ["/retrieve", "/retrieve"] and index.calls == 2


def test_a_lasting_500_names_the_status_and_the_servers_detail(threaded_service):
    start, seen = threaded_service
    url = start(FlakyIndex(failures=100))
    with RetrieverClient(url, retries=1, backoff_s=0.01) as client, pytest.raises(RetrieverError) as caught:
        client.retrieve(["q"], 3)
    assert url in str(caught.value) and "HTTP 500" in str(caught.value) and "disk on fire" in str(caught.value)
    assert seen == ["/retrieve", "/retrieve"]


def test_a_4xx_is_not_retried(threaded_service):
    start, seen = threaded_service
    with RetrieverClient(start(FlakyIndex()), retries=2, backoff_s=0.01) as client:
        with pytest.raises(RetrieverError, match="rejected the request.*HTTP 422"):
            client._call("POST", "/retrieve", {"queries": [], "topk": 3})  # the public methods never send this
    assert seen == ["/retrieve"]


def test_a_slow_service_times_out_after_the_retries(threaded_service):
    start, seen = threaded_service
    with RetrieverClient(start(FlakyIndex(delay_s=1.0)), timeout_s=0.2, retries=1, backoff_s=0.01) as client:
        began = time.monotonic()
        with pytest.raises(RetrieverError, match="timed out after 0.2s"):
            client.retrieve(["q"], 3)
    assert time.monotonic() - began < 1.0 and seen == ["/retrieve", "/retrieve"]


def test_a_down_service_fails_fast_naming_the_url_and_the_fix():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with RetrieverClient(url, timeout_s=0.5, retries=2, backoff_s=0.05) as client:
        began = time.monotonic()
        with pytest.raises(RetrieverError) as caught:
            client.retrieve(["q"], 3)
        with pytest.raises(RetrieverError, match="not healthy after 0.3s"):
            client.wait_until_healthy(0.3)
    message = str(caught.value)
    assert time.monotonic() - began < 3.0
    assert url in message and "could not connect" in message and "3 attempts" in message
    assert f"posttrain serve-retriever --corpus CORPUS.jsonl --index bm25 --port {port}" in message
    assert "env.retriever.url" in message


def test_a_service_with_latency_answers_each_search_late_but_side_by_side(threaded_service):
    from concurrent.futures import ThreadPoolExecutor

    start, _ = threaded_service
    url = start(FlakyIndex(), latency_ms=300)
    with RetrieverClient(url) as client:
        begin = time.perf_counter()
        client.retrieve(["q"], 3)
        alone = time.perf_counter() - begin
        begin = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda q: client.retrieve([q], 3), ["a", "b", "c", "d"]))
        four = time.perf_counter() - begin
    assert alone >= 0.3 and four < 4 * 0.3  # four requests waited at the same time, not one after another
