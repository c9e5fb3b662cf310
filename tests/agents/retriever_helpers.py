"""What the retriever tests share: a five-document corpus, a flaky index, a service in a thread, and
small HTTP helpers. The fixtures built on them are in conftest.py."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn

from posttrain.agents.retriever import BM25Index, Document, Hit
from posttrain.agents.retriever.process import free_port

DOCUMENTS = [
    Document("0", '"Aspirin"\nAspirin is a medicine used to reduce pain and fever.'),
    Document("1", '"Volcano"\nA volcano is a rupture in the crust of a planet where lava escapes.'),
    Document("2", '"Penguin"\nThe penguin is a flightless bird living in the southern hemisphere.'),
    Document("3", '"Medicine"\nMedicine is the science of diagnosing and treating disease and pain.'),
    Document("4", '"Jazz"\nJazz is a music genre that originated in New Orleans.'),
]

# BM25 as Lucene scores it (posttrain/agents/retriever/index.py), worked by hand on DOCUMENTS. bm25s
# keeps words of 2+ characters, lowercased, English stopwords dropped, the title line included, so
# the documents hold 7, 8, 7, 7 and 7 terms: avgdl = 36 / 5 = 7.2. A term seen tf times in a document
# of dl terms scores idf * tf / (tf + K1 * (1 - B + B * dl / avgdl)), idf = ln(1 + (N - df + 0.5) / (df + 0.5)).
K1, B = 1.5, 0.75
NORM_7 = 1 - B + B * 7 / 7.2  # the length norm of a 7-term document
# "flightless bird" on document 2 [penguin penguin flightless bird living southern hemisphere]: each
# word once, in no other document (df 1, idf ln 4).
FLIGHTLESS_BIRD = 2 * math.log(4) / (1 + K1 * NORM_7)  # 1.1231


def write_corpus(path: Path, documents: list[Document]) -> Path:
    path.write_text("".join(json.dumps({"id": d.id, "contents": d.contents}) + "\n" for d in documents))
    return path


def post(url: str, body: object) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=10)
    return httpx.post(f"{url}/retrieve", json=body, timeout=10)


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


def small_service(start, index=None, **options) -> str:
    """A threaded service with limits small enough to hit: 4 queries, 10 characters, 1000 bytes."""
    limits = {"max_queries": 4, "max_query_chars": 10, "max_body_bytes": 1000} | options
    return start(index or BM25Index(DOCUMENTS), **limits)


def serves_jazz(url: str, headers: dict[str, str] | None = None) -> bool:
    response = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers=headers, timeout=10)
    return response.status_code == 200 and response.json()["result"][0][0]["document"]["id"] == "4"

