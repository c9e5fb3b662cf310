"""The retriever service's limits on what it reads (body size, query count and length, bodies Python
cannot decode), the schema that states them, and a fuzzer against that schema."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.agents.retriever import BM25Index, create_app
from tests.agents.retriever_helpers import DOCUMENTS, FlakyIndex, post, serve_in_thread, serves_jazz, small_service


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
