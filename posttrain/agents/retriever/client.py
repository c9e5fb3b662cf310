"""A blocking client for the retriever service (ours, or Search-R1's ``retrieval_server.py``).

``RetrieverClient(url).retrieve(queries, topk)`` sends all queries in ONE ``POST /retrieve`` and
returns one hit list per query, best first. ``url`` is the service's base URL; a URL ending in
``/retrieve`` (as Search-R1 configs write it) is accepted too. With ``token`` every request carries
``Authorization: Bearer <token>``, which a service serving other machines asks for.

Failures: a refused connection, a timeout (``timeout_s`` per attempt), another transport error or a
5xx answer is retried ``retries`` times, sleeping ``backoff_s``, then twice that, and so on; after
the last attempt a ``RetrieverError`` names the URL, what happened (refused / timed out after Xs /
the HTTP status and the server's detail) and what to do (start the service with
``posttrain serve-retriever ...`` or point ``env.retriever.url`` at it). A 4xx answer means the
request itself is wrong; it is not retried, and the message says which limit (413: the body, 422:
the schema's, as the server's detail names it) or, for a 401, how to give the token. An answer in an
unexpected shape is a ``RetrieverError``.

``health()`` returns the service's ``/health`` report; ``wait_until_healthy(deadline_s)`` polls it
until it is healthy or ``deadline_s`` seconds have passed. Close the client with ``close()`` or use
it as a context manager.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import httpx

from posttrain.agents.retriever.types import MAX_QUERIES, MAX_TOPK, TOKEN_ENV, Document, Hit, RetrieverError

_HEALTH_POLL_S = 0.2


class Health(TypedDict):
    status: str
    documents: int
    index: str


class RetrieverClient:
    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.2,
                 token: str | None = None):
        self.url = _base_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"authorization": f"Bearer {token}"} if token else None
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Hits for every query: one request, or one per MAX_QUERIES queries for a longer list
        (the service refuses more per request); [] for no queries, without a request."""
        if not 1 <= topk <= MAX_TOPK:
            raise RetrieverError(f"topk={topk}: the service returns 1 to {MAX_TOPK} hits per query")
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), MAX_QUERIES):
            piece = list(queries[start : start + MAX_QUERIES])
            body = self._call("POST", "/retrieve", {"queries": piece, "topk": topk, "return_scores": True})
            hits += self._parse_hits(body, len(piece))
        return hits

    def health(self) -> Health:
        return self._call("GET", "/health")

    def is_healthy(self) -> bool:
        """One /health probe, no retries: True when the service answers that it is ok."""
        return self._health_problem() is None

    def wait_until_healthy(self, deadline_s: float) -> None:
        """Poll /health until the service is ok; RetrieverError when ``deadline_s`` seconds pass first."""
        give_up_at = time.monotonic() + deadline_s
        while (problem := self._health_problem()) is not None:
            if time.monotonic() >= give_up_at:
                raise RetrieverError(f"the retriever at {self.url} is not healthy after {deadline_s:g}s ({problem}). "
                                     f"{self._start_hint()}")
            time.sleep(_HEALTH_POLL_S)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._http.request(method, path, json=payload)
            except httpx.TransportError as err:
                problem = self._transport_problem(err)
                continue
            if response.status_code < 400:
                return self._json(response, path)
            problem = f"HTTP {response.status_code}: {_detail(response)}"
            if response.status_code < 500:
                raise RetrieverError(f"the retriever at {self.url}{path} rejected the request ({problem}); "
                                     f"{_rejection_hint(response.status_code, self.url)}")
        attempts = f"{self.retries + 1} attempt{'s' if self.retries else ''}"
        hint = self._start_hint() if not problem.startswith("HTTP") else "The retriever's log has the traceback."
        raise RetrieverError(f"the retriever at {self.url}{path} failed after {attempts}: {problem}. {hint}")

    def _transport_problem(self, err: httpx.TransportError) -> str:
        if isinstance(err, httpx.TimeoutException):
            return f"timed out after {self.timeout_s:g}s"
        if isinstance(err, httpx.ConnectError):
            return f"could not connect ({err})"
        return f"{type(err).__name__} ({err})"

    def _health_problem(self) -> str | None:
        try:
            response = self._http.get("/health")
        except httpx.TransportError as err:
            return self._transport_problem(err)
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {_detail(response)}"
        try:
            status = response.json().get("status")
        except (ValueError, AttributeError):
            status = None
        return None if status == "ok" else f"/health answered {response.text[:200]!r}"

    def _start_hint(self) -> str:
        port = httpx.URL(self.url).port or 8000
        return (f"Is it running? Start it with `posttrain serve-retriever --corpus CORPUS.jsonl --index bm25 "
                f"--port {port}`, or set env.retriever.url to the URL where it runs.")

    def _json(self, response: httpx.Response, path: str) -> Any:
        try:
            return response.json()
        except ValueError as err:
            raise RetrieverError(f"the retriever at {self.url}{path} answered something that is not JSON "
                                 f"({response.text[:200]!r}); is {self.url} a retriever service?") from err

    def _parse_hits(self, body: Any, query_count: int) -> list[list[Hit]]:
        try:
            result = body["result"]
            hits = [[Hit(Document(str(hit["document"]["id"]), hit["document"]["contents"]), float(hit["score"]))
                     for hit in query_hits] for query_hits in result]
        except (KeyError, TypeError, ValueError) as err:
            raise RetrieverError(f"the retriever at {self.url} answered in an unexpected shape ({err!r}); expected "
                                 '{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}') from err
        if len(hits) != query_count:
            raise RetrieverError(f"the retriever at {self.url} answered {len(hits)} hit lists for {query_count} queries")
        return hits


def _rejection_hint(status: int, url: str) -> str:
    if status == 401:
        return (f"it wants a token: export it in the variable env.retriever.token_env names ({TOKEN_ENV} by default), "
                "the token it was started with (--token or that variable)")
    if status == 413:
        return "send fewer or shorter queries per request, or start the service with a larger --max-body-bytes"
    return (f"check that {url} is a retriever service and that the request fits it (1 to {MAX_QUERIES} queries "
            f"by default, topk 1 to {MAX_TOPK}; the detail names the limit)")


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/retrieve")


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase
