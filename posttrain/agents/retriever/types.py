"""What a retriever returns, in the shape of Search-R1's retriever service.

A response to ``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` is
``{"result": [[{"document": {"id": ..., "contents": ...}, "score": ...}, ...], ...]}``: one list
of hits per query, best first. ``contents`` is ``'"Title"\\ntext'`` as in Search-R1's corpora.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.errors import PosttrainError

MAX_QUERIES = 1024  # queries in one request; a client splits longer lists
MAX_TOPK = 100      # hits per query
TOKEN_ENV = "POSTTRAIN_RETRIEVER_TOKEN"  # where `serve-retriever` finds its token when --token is not given


@dataclass(frozen=True)
class Document:
    id: str
    contents: str

    @property
    def title(self) -> str:
        """The first line without its quotes ("" when the contents have a single line)."""
        first, newline, _ = self.contents.partition("\n")
        return first.strip().strip('"') if newline else ""

    @property
    def text(self) -> str:
        """The contents after the title line (all of it when there is no title line)."""
        first, newline, rest = self.contents.partition("\n")
        return rest.strip() if newline else first.strip()


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float


class RetrieverError(PosttrainError):
    """The retriever could not answer (down, timed out, or an error reply); the message says which.
    Exit code 2: a service to fix."""

    exit_code = 2
