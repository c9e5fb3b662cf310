"""The retriever as an HTTP service, wire-compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` takes ``{"queries": [str, ...], "topk": 3, "return_scores": true}`` (topk 1 to
100, defaults as shown) and answers one hit list per query, best first:

    {"result": [[{"document": {"id": "7", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

With ``"return_scores": false`` each hit is the bare document, ``{"id": ..., "contents": ...}``, as
Search-R1's server answers then.

Limits, so that one request cannot take the service's memory or its thread pool (each is an
argument of ``create_app``/``serve`` and an option of ``posttrain serve-retriever``):

- a body over ``max_body_bytes`` (default 8 MiB) answers 413, checked before anything parses it:
  at once from its Content-Length, or as soon as a chunked body passes the limit;
- more than ``max_queries`` queries (default 1024, what ``RetrieverClient`` sends at most in one
  request) or a query longer than ``max_query_chars`` characters (default 1024) answers 422 naming
  the limit, as does any other request that does not fit the schema (no ``queries``, an empty list,
  ``topk`` out of range, a body that is not JSON). The schema at ``/openapi.json`` states the limits.

An exception inside the index answers 500 with ``{"detail": "..."}`` and is logged with its
traceback. After every one of these answers the server goes on serving.

Access: ``serve`` binds 127.0.0.1 unless told otherwise. On any host but a loopback address it
refuses to start without a token (``--token``, or the environment variable
``POSTTRAIN_RETRIEVER_TOKEN``): anyone who can reach the port could otherwise use it. With a token,
every request (``/health`` and ``/openapi.json`` too) must carry ``Authorization: Bearer <token>``
or gets 401; the start line says so.

``GET /health`` answers ``{"status": "ok", "documents": N, "index": "bm25" | "dense"}`` once the
index is built (the server does not listen before that), so a client can poll it while starting.

``serve`` is what ``posttrain serve-retriever`` runs: check the host and token, load the corpus,
build the index, print one line saying where it serves and what it asks of clients, and run
uvicorn until stopped.
"""

# No `from __future__ import annotations`: FastAPI resolves an endpoint's annotations in the
# module's globals, and the request model is built inside create_app with that app's limits.

import hmac
import ipaddress
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posttrain.errors import InputError
from posttrain.agents.retriever.corpus import load_corpus
from posttrain.agents.retriever.index import SearchIndex, build_index
from posttrain.agents.retriever.types import MAX_QUERIES, MAX_TOPK, TOKEN_ENV, Document, Hit

DEFAULT_TOPK = 3
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
DEFAULT_MAX_QUERY_CHARS = 1024

logger = logging.getLogger("posttrain.retriever")


class ServeError(InputError):
    """The service will not start as asked (an exposed host without a token, a limit below 1)."""


def create_app(index: SearchIndex, documents: Sequence[Document], *, token: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_queries: int = MAX_QUERIES,
               max_query_chars: int = DEFAULT_MAX_QUERY_CHARS, latency_ms: float = 0.0) -> FastAPI:
    """The FastAPI app serving ``index`` (built over ``documents``) at /retrieve and /health; with a
    ``token``, only to requests that carry it. ``latency_ms``: every /retrieve answer waits this long
    first (a remote service's round trip, for benchmarks); requests wait side by side."""
    check_limits(max_body_bytes, max_queries, max_query_chars)
    if latency_ms < 0:
        raise ServeError(f"--latency-ms {latency_ms:g} must be >= 0")
    app = FastAPI(title="posttrain retriever")
    health_report = {"status": "ok", "documents": len(documents), "index": index.kind}

    class RetrieveRequest(BaseModel):
        queries: list[Annotated[str, Field(max_length=max_query_chars)]] = Field(min_length=1, max_length=max_queries)
        topk: int = Field(default=DEFAULT_TOPK, ge=1, le=MAX_TOPK)
        return_scores: bool = True

    # FastAPI's own 422 echoes each bad value back, which is up to a whole body, and fails with a
    # 500 when that value holds a lone surrogate (valid JSON, not encodable as UTF-8).
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [{key: value for key, value in problem.items() if key != "input"} for problem in error.errors()]
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(problems)})

    # FastAPI answers a body json.loads cannot decode as JSON syntax with 422, but one that is not
    # UTF-8, nests past Python's recursion limit or holds an integer of thousands of digits with a
    # bare 400; all of them are "not JSON" here.
    @app.exception_handler(HTTPException)
    async def unreadable_body(request: Request, error: HTTPException) -> Response:
        if error.status_code == 400 and isinstance(error.__cause__, (ValueError, RecursionError)):
            cause = f"{type(error.__cause__).__name__}: {error.__cause__}"[:200]
            problem = {"type": "json_invalid", "loc": ["body"], "msg": f"the body is not JSON this service can read ({cause})"}
            return JSONResponse(status_code=422, content={"detail": [problem]})
        return await http_exception_handler(request, error)

    @app.get("/health")
    def health() -> dict[str, object]:
        return health_report

    # A plain `def`: FastAPI runs it in its thread pool, so a slow search never blocks /health.
    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> JSONResponse:
        if latency_ms:
            time.sleep(latency_ms / 1000)  # in the thread pool: other requests go on meanwhile
        try:
            hits = index.search(request.queries, request.topk)
        except Exception as err:  # noqa: BLE001 - any index failure becomes a 500, the server lives on
            logger.exception("retriever: the %s index failed on a request of %d queries", index.kind, len(request.queries))
            detail = f"the {index.kind} index failed on this request: {type(err).__name__}: {err}"
            return JSONResponse(status_code=500, content={"detail": detail})
        result = [[_hit_json(hit, request.return_scores) for hit in query_hits] for query_hits in hits]
        return JSONResponse(content={"result": result})

    app.add_middleware(RequestGuard, token=token, max_body_bytes=max_body_bytes)
    return app


class RequestGuard:
    """ASGI middleware in front of the app: the token (401), then the body's size (413), before the
    app reads or parses anything. The body is read here, up to the limit, and handed on whole."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int):
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.expected is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await _reply(scope, receive, send, 401, "this retriever needs its token: send the header "
                         "`Authorization: Bearer <token>` (posttrain clients: the variable env.retriever.token_env names)",
                         {"www-authenticate": "Bearer"})
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _reply(scope, receive, send, 413, self._too_large())
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:  # a chunked body, or one longer than it declared
                await _reply(scope, receive, send, 413, self._too_large())
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    def _too_large(self) -> str:
        return (f"the request body is over {self.max_body_bytes} bytes, this service's limit "
                "(serve-retriever --max-body-bytes); send fewer or shorter queries per request")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then whatever the client sends next."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _reply(scope: Scope, receive: Receive, send: Send, status: int, detail: str,
                 headers: dict[str, str] | None = None) -> None:
    await JSONResponse(status_code=status, content={"detail": detail}, headers=headers)(scope, receive, send)


def _hit_json(hit: Hit, with_score: bool) -> dict[str, object]:
    document = {"id": hit.document.id, "contents": hit.document.contents}
    return {"document": document, "score": hit.score} if with_score else document


def check_limits(max_body_bytes: int, max_queries: int, max_query_chars: int) -> None:
    limits = {"--max-body-bytes": max_body_bytes, "--max-queries": max_queries, "--max-query-chars": max_query_chars}
    wrong = [f"{option} {value}" for option, value in limits.items() if value < 1]
    if wrong:
        raise ServeError(f"{', '.join(wrong)}: each limit must be >= 1")


def check_host(host: str, token: str | None) -> None:
    """Refuse a host other machines can reach when there is no token to keep them out."""
    if not token and not is_loopback(host):
        raise ServeError(
            f"--host {host} lets other machines reach the retriever, so it needs a token: pass --token TOKEN or set "
            f"{TOKEN_ENV}=TOKEN; clients then send `Authorization: Bearer TOKEN` (posttrain runs: export the "
            f"variable that env.retriever.token_env names, {TOKEN_ENV} by default). Or serve on 127.0.0.1 (the default)."
        )


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(corpus_path: str | Path, index_kind: str, host: str = "127.0.0.1", port: int = 8000,
          cache_dir: str | Path | None = None, *, token: str | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_queries: int = MAX_QUERIES,
          max_query_chars: int = DEFAULT_MAX_QUERY_CHARS, latency_ms: float = 0.0) -> None:
    """Check the host and the token, load the corpus, build the index and serve it with uvicorn
    until interrupted. ``ServeError`` before any loading when the host needs a token and has none."""
    import uvicorn

    check_host(host, token)
    check_limits(max_body_bytes, max_queries, max_query_chars)
    documents = load_corpus(corpus_path)
    index = build_index(index_kind, documents, cache_dir=cache_dir)
    app = create_app(index, documents, token=token, max_body_bytes=max_body_bytes, max_queries=max_queries,
                     max_query_chars=max_query_chars, latency_ms=latency_ms)
    access = ("every request must carry `Authorization: Bearer <token>` (the token given by --token or "
              f"{TOKEN_ENV})" if token else "no token: only this machine can reach it")
    print(f"posttrain retriever: serving {len(documents)} documents ({index_kind}) on http://{host}:{port}; {access}; "
          f"limits: {max_body_bytes} bytes a request, {max_queries} queries, {max_query_chars} characters a query", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
