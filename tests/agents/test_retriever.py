"""The retriever: corpus loading, BM25 and dense ranking, the dense cache, the real HTTP service (its limits,
its token, a fuzzer against its schema), the client."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.agents.retriever import (
    BM25Index, CorpusError, DenseIndex, Document, Hit, RetrieverClient, RetrieverError, RetrieverProcess, ServeError,
    build_index, create_app, load_corpus,
)
from posttrain.agents.retriever.process import free_port

DOCUMENTS = [
    Document("0", '"Aspirin"\nAspirin is a medicine used to reduce pain and fever.'),
    Document("1", '"Volcano"\nA volcano is a rupture in the crust of a planet where lava escapes.'),
    Document("2", '"Penguin"\nThe penguin is a flightless bird living in the southern hemisphere.'),
    Document("3", '"Medicine"\nMedicine is the science of diagnosing and treating disease and pain.'),
    Document("4", '"Jazz"\nJazz is a music genre that originated in New Orleans.'),
]


def write_corpus(path: Path, documents: list[Document]) -> Path:
    path.write_text("".join(json.dumps({"id": d.id, "contents": d.contents}) + "\n" for d in documents))
    return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", DOCUMENTS)


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

@pytest.fixture(scope="module")
def dense_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dense-cache")


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


# --- the real service, started as `posttrain serve-retriever` -----------------------------------

@pytest.fixture(scope="module")
def bm25_url(corpus_file):
    with RetrieverProcess(corpus_file, "bm25", startup_timeout_s=60) as service:
        yield service.url


def post(url: str, body: object) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=10)
    return httpx.post(f"{url}/retrieve", json=body, timeout=10)


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
    assert body["result"][0] == [{"document": {"id": "2", "contents": DOCUMENTS[2].contents}, "score": pytest.approx(body["result"][0][0]["score"])}]
    assert [hit["document"]["id"] for hit in body["result"][1]] == ["3", "0"]


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


def test_the_client_against_the_real_service(bm25_url):
    with RetrieverClient(bm25_url) as client:
        assert client.health() == {"status": "ok", "documents": 5, "index": "bm25"}
        penguin, blank = client.retrieve(["flightless bird", ""], 2)
        assert penguin == [Hit(DOCUMENTS[2], penguin[0].score)] and blank == []
        assert client.retrieve([], 3) == []
    with RetrieverClient(f"{bm25_url}/retrieve/") as client:  # as Search-R1 configs write the URL
        assert client.retrieve(["jazz"], 1)[0][0].document == DOCUMENTS[4]


def test_the_dense_service_serves_and_caches_its_index(corpus_file, tmp_path):
    with RetrieverProcess(corpus_file, "dense", cache_dir=tmp_path, startup_timeout_s=120) as service:
        with RetrieverClient(service.url) as client:
            assert client.health() == {"status": "ok", "documents": 5, "index": "dense"}
            [hits] = client.retrieve(["Which bird cannot fly?"], 3)
    assert hits[0].document == DOCUMENTS[2] and len(hits) == 3
    assert len(list(tmp_path.glob("*/index.faiss"))) == 1


def test_a_process_that_dies_at_startup_raises_with_its_log(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("oops\n")
    with pytest.raises(RetrieverError, match="exited with code 2") as caught:
        RetrieverProcess(bad, "bm25", startup_timeout_s=60)
    assert "line 1: not valid JSON" in str(caught.value)


# --- client failures, against a service in a thread ---------------------------------------------

class FlakyIndex:
    """Fails its first ``failures`` searches; takes ``delay_s`` per search."""

    kind = "bm25"

    def __init__(self, failures: int = 0, delay_s: float = 0.0):
        self.failures, self.delay_s, self.calls = failures, delay_s, 0

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.calls <= self.failures:
            raise RuntimeError("disk on fire")
        return [[Hit(DOCUMENTS[0], 1.0)] for _ in queries]


def serve_in_thread(app) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` with uvicorn in a thread on a free port; returns (url, stop)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return f"http://127.0.0.1:{port}", stop


@pytest.fixture
def threaded_service():
    """Serve an index with uvicorn in a thread; yields (start(index, **create_app options) -> url,
    paths of the requests that reached the app)."""
    stops: list[Callable[[], None]] = []
    seen: list[str] = []

    def start(index, **options) -> str:
        app = create_app(index, DOCUMENTS, **options)

        @app.middleware("http")
        async def record(request, call_next):
            seen.append(request.url.path)
            return await call_next(request)

        url, stop = serve_in_thread(app)
        stops.append(stop)
        return url

    yield start, seen
    for stop in stops:
        stop()


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


def test_more_queries_than_one_request_holds_are_split(bm25_url):
    from posttrain.agents.retriever.types import MAX_QUERIES

    queries = ["jazz"] * (MAX_QUERIES + 5)
    with RetrieverClient(bm25_url) as client:
        hits = client.retrieve(queries, 1)
        assert len(hits) == len(queries) and hits[0] == hits[-1]
        with pytest.raises(RetrieverError, match="topk=101"):
            client.retrieve(["jazz"], 101)


def test_bm25_leaves_numba_unimported():
    """bm25s imports numba when it can; numba in the process breaks a vLLM engine created after it."""
    code = (
        "import sys\nfrom posttrain.agents.retriever import Document, build_index\n"
        "build_index('bm25', [Document('1', 'apple pie'), Document('2', 'plum jam')]).search(['apple'], 1)\n"
        "assert 'bm25s' in sys.modules and 'numba' not in sys.modules, sorted(m for m in sys.modules if 'numba' in m)[:3]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --- limits, the token, and a fuzzer ------------------------------------------------------------

def small_service(start, index=None, **options) -> str:
    """A threaded service with limits small enough to hit: 4 queries, 10 characters, 1000 bytes."""
    limits = {"max_queries": 4, "max_query_chars": 10, "max_body_bytes": 1000} | options
    return start(index or BM25Index(DOCUMENTS), **limits)


def serves_jazz(url: str, headers: dict[str, str] | None = None) -> bool:
    response = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers=headers, timeout=10)
    return response.status_code == 200 and response.json()["result"][0][0]["document"]["id"] == "4"


def test_a_body_over_the_limit_gets_413_before_anything_parses_it(threaded_service):
    start, _ = threaded_service
    index = FlakyIndex()
    url = small_service(start, index)
    garbage = b"{" * 1001  # not JSON: a parser would answer 422, the size check answers first
    declared = httpx.post(f"{url}/retrieve", content=garbage, headers={"content-type": "application/json"}, timeout=10)
    chunked = httpx.post(f"{url}/retrieve", content=iter([b"{" * 400] * 3), headers={"content-type": "application/json"}, timeout=10)
    assert "content-length" not in chunked.request.headers and chunked.request.headers["transfer-encoding"] == "chunked"
    for response in (declared, chunked):
        assert response.status_code == 413
        assert "over 1000 bytes" in response.json()["detail"] and "--max-body-bytes" in response.json()["detail"]
    at_the_limit = json.dumps({"queries": ["jazz"]}).encode().ljust(1000)  # JSON allows the trailing spaces
    response = httpx.post(f"{url}/retrieve", content=at_the_limit, headers={"content-type": "application/json"}, timeout=10)
    assert len(at_the_limit) == 1000 and response.status_code == 200
    assert index.calls == 1  # the index saw only the request within the limit


def test_too_many_or_too_long_queries_get_422_naming_the_limit_and_the_service_keeps_serving(threaded_service):
    start, _ = threaded_service
    url = small_service(start)
    too_many = post(url, {"queries": ["jazz"] * 5})
    too_long = post(url, {"queries": ["jazz", "x" * 11]})
    assert too_many.status_code == too_long.status_code == 422
    assert too_many.json()["detail"][0]["msg"] == "List should have at most 4 items after validation, not 5"
    assert too_long.json()["detail"] == [{"type": "string_too_long", "loc": ["body", "queries", 1],
                                          "msg": "String should have at most 10 characters", "ctx": {"max_length": 10}}]
    assert post(url, {"queries": ["jazz"] + ["x" * 10] * 3}).status_code == 200  # exactly at both limits
    assert serves_jazz(url)


def test_the_openapi_schema_states_the_limits(threaded_service):
    start, _ = threaded_service
    schema = httpx.get(f"{small_service(start)}/openapi.json").json()["components"]["schemas"]["RetrieveRequest"]
    queries = schema["properties"]["queries"]
    assert (queries["minItems"], queries["maxItems"], queries["items"]["maxLength"]) == (1, 4, 10)
    assert (schema["properties"]["topk"]["minimum"], schema["properties"]["topk"]["maximum"]) == (1, 100)


@pytest.mark.parametrize("body, problem", [
    # Valid JSON that decodes to a string UTF-8 cannot encode: FastAPI's own 422 echoed it and failed with a 500.
    (b'{"queries": ["\\ud800"]}', "string_unicode"),
    (b'{"queries": ["jazz"], "topk": "\\udfff"}', "string_unicode"),
    # Bodies FastAPI answered with a bare 400 "There was an error parsing the body".
    (b"\x80", "UnicodeDecodeError"),
    (b"[" * 5000, "RecursionError"),
    (b'{"queries": ["jazz"], "topk": ' + b"9" * 5000 + b"}", "4300 digits"),
], ids=["surrogate-query", "surrogate-topk", "not-utf8", "deep-nesting", "huge-integer"])
def test_bodies_python_cannot_decode_get_422_and_the_service_keeps_serving(threaded_service, body, problem):
    start, _ = threaded_service
    url = small_service(start, max_body_bytes=10_000)
    response = httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == 422 and problem in json.dumps(response.json()["detail"])
    assert serves_jazz(url)


def json_values():
    """Any JSON value: strings with every code point (lone surrogates too), big numbers, nesting."""
    text = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | text
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4), max_leaves=12)


def request_shapes(schema: dict):
    """Bodies shaped like the schema's request, with sizes on both sides of its limits."""
    properties = schema["properties"]
    max_items, max_chars = properties["queries"]["maxItems"], properties["queries"]["items"]["maxLength"]
    low, high = properties["topk"]["minimum"], properties["topk"]["maximum"]
    query = st.text(max_size=max_chars + 2)  # lone surrogates come from json_values
    return st.fixed_dictionaries(
        {"queries": st.lists(query, max_size=max_items + 2) | json_values()},
        optional={"topk": st.integers(int(low) - 2, int(high) + 2) | json_values(),
                  "return_scores": st.booleans() | json_values(), "extra": json_values()},
    )


@pytest.fixture(scope="module")
def fuzzed_service():
    """A service with limits a fuzzer reaches often (4 queries, 10 characters, 300 bytes), an HTTP
    client for it, and the request schema it serves."""
    app = create_app(BM25Index(DOCUMENTS), DOCUMENTS, max_queries=4, max_query_chars=10, max_body_bytes=300)
    url, stop = serve_in_thread(app)
    with httpx.Client(base_url=url, timeout=10) as client:
        yield client, client.get("/openapi.json").json()["components"]["schemas"]["RetrieveRequest"]
    stop()


def test_fuzzed_requests_get_200_413_or_422_and_the_service_keeps_serving(fuzzed_service):
    client, schema = fuzzed_service
    bodies = (st.builds(lambda value: json.dumps(value).encode(), request_shapes(schema) | json_values())
              | st.binary(max_size=400))
    answered: set[int] = set()

    @settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=bodies, chunked=st.booleans())
    def each_request(body: bytes, chunked: bool) -> None:
        content = iter([body[:150], body[150:]]) if chunked else body
        response = client.post("/retrieve", content=content, headers={"content-type": "application/json"})
        answered.add(response.status_code)
        assert response.status_code in (200, 413, 422), (response.status_code, response.text[:300])
        if response.status_code == 200:
            assert len(response.json()["result"]) == len(json.loads(body)["queries"])
        else:
            assert response.json()["detail"]
        normal = client.post("/retrieve", json={"queries": ["jazz"]})
        assert normal.status_code == 200 and normal.json()["result"][0][0]["document"]["id"] == "4"

    each_request()
    assert answered == {200, 413, 422}  # the fuzzer reached every answer, so the property covered each path


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("retriever.example.org", False),
])
def test_only_a_loopback_host_serves_without_a_token(host, allowed):
    from posttrain.agents.retriever.service import check_host

    check_host(host, "a-token")  # any host with a token
    if allowed:
        check_host(host, None)
    else:
        with pytest.raises(ServeError, match=f"--host {re.escape(host)} lets other machines reach"):
            check_host(host, None)


def test_serve_retriever_on_all_interfaces_without_a_token_refuses_before_loading(tmp_path, monkeypatch, capsys):
    from posttrain.cli import main

    monkeypatch.delenv("POSTTRAIN_RETRIEVER_TOKEN", raising=False)
    missing = tmp_path / "missing.jsonl"  # the refusal comes first, so the corpus is never opened
    assert main(["serve-retriever", "--corpus", str(missing), "--host", "0.0.0.0"]) == 2
    message = capsys.readouterr().err
    assert "--host 0.0.0.0 lets other machines reach the retriever, so it needs a token" in message
    assert "--token TOKEN" in message and "POSTTRAIN_RETRIEVER_TOKEN=TOKEN" in message
    assert "`Authorization: Bearer TOKEN`" in message and "env.retriever.token_env" in message
    assert "does not exist" not in message


def test_with_a_token_a_request_without_it_or_with_another_gets_401(threaded_service):
    start, _ = threaded_service
    index = FlakyIndex()
    url = start(index, token="s3cret")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}, {"authorization": "Bearer s3cret2"}):
        response = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers=headers, timeout=10)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer <token>" in response.json()["detail"]
    assert httpx.get(f"{url}/health").status_code == 401 and httpx.get(f"{url}/openapi.json").status_code == 401
    assert index.calls == 0  # none of them reached the index
    with_token = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers={"authorization": "Bearer s3cret"}, timeout=10)
    assert with_token.status_code == 200 and index.calls == 1


def test_the_client_sends_its_token_and_names_the_fix_for_a_401(threaded_service):
    start, seen = threaded_service
    url = start(FlakyIndex(), token="s3cret")
    with RetrieverClient(url, token="s3cret") as client:
        assert client.health()["status"] == "ok" and client.retrieve(["q"], 1) == [[Hit(DOCUMENTS[0], 1.0)]]
    seen.clear()
    with RetrieverClient(url, retries=2, backoff_s=0.01) as client, pytest.raises(RetrieverError) as caught:
        client.retrieve(["q"], 1)
    assert "HTTP 401" in str(caught.value) and "env.retriever.token_env" in str(caught.value)
    assert seen == ["/retrieve"]  # a 401 is not retried


def test_a_run_sends_the_token_from_the_variable_token_env_names(threaded_service, monkeypatch):
    from posttrain.config.schema import RetrieverConfig
    from posttrain.rollout.retriever import open_retriever

    start, _ = threaded_service
    url = start(FlakyIndex(), token="s3cret")
    monkeypatch.delenv("MY_RETRIEVER_TOKEN", raising=False)
    config = RetrieverConfig(url=url, token_env="MY_RETRIEVER_TOKEN", retries=0)
    with pytest.raises(RetrieverError, match="HTTP 401"):
        open_retriever(config, None)
    monkeypatch.setenv("MY_RETRIEVER_TOKEN", "s3cret")
    handle = open_retriever(config, None)
    try:
        assert handle.client.retrieve(["q"], 1) == [[Hit(DOCUMENTS[0], 1.0)]]
    finally:
        handle.close()


def test_a_started_service_gets_its_token_by_environment_only(monkeypatch):
    from posttrain.agents.retriever.process import _child_env

    monkeypatch.setenv("POSTTRAIN_RETRIEVER_TOKEN", "someone-elses")
    assert "POSTTRAIN_RETRIEVER_TOKEN" not in _child_env(None)
    assert _child_env("s3cret")["POSTTRAIN_RETRIEVER_TOKEN"] == "s3cret"


def test_serve_retriever_on_all_interfaces_with_a_token_says_so_and_enforces_it(corpus_file, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_RETRIEVER_TOKEN", "not-this-one")  # the process hands the child its own
    with RetrieverProcess(corpus_file, "bm25", host="0.0.0.0", token="s3cret", startup_timeout_s=60) as service:
        assert "s3cret" not in " ".join(service.command)
        local = f"http://127.0.0.1:{service.port}"
        assert httpx.post(f"{local}/retrieve", json={"queries": ["jazz"]}, timeout=10).status_code == 401
        assert serves_jazz(local, {"authorization": "Bearer s3cret"})
        log = service.log_tail()
    assert "on http://0.0.0.0:" in log and "every request must carry `Authorization: Bearer <token>`" in log
    assert "s3cret" not in log


def test_a_token_in_place_of_its_variable_name_is_refused_without_printing_it():
    from posttrain.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config([], ["env.retriever.token_env=tok-3f9a.b7"])
    message = str(caught.value)
    assert "env.retriever.token_env" in message and "not the token itself" in message and "tok-3f9a.b7" not in message
    assert load_config([], ["env.retriever.token_env=MY_TOKEN_2"]).env.retriever.token_env == "MY_TOKEN_2"
    assert load_config([], ["env.retriever.token_env=null"]).env.retriever.token_env is None
