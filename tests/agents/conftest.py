"""Fixtures of the retriever tests: the corpus file, one real BM25 service for the session, the
dense index's cache, and services in a thread (see retriever_helpers.py for what they serve)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from posttrain.agents.retriever import RetrieverProcess, create_app
from tests.agents.retriever_helpers import DOCUMENTS, serve_in_thread, write_corpus


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """DOCUMENTS as a corpus.jsonl."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", DOCUMENTS)


@pytest.fixture(scope="session")
def bm25_url(corpus_file):
    """The real service over DOCUMENTS, started as `posttrain serve-retriever` (one process for every test file)."""
    with RetrieverProcess(corpus_file, "bm25", startup_timeout_s=60) as service:
        yield service.url


@pytest.fixture(scope="session")
def dense_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dense-cache")


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
