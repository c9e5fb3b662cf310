"""The retriever a search agent calls: a corpus, a BM25 or dense index, and the HTTP service around them.

The service speaks Search-R1's ``POST /retrieve`` protocol (see ``service``); ``RetrieverClient``
calls it, ``RetrieverProcess`` runs it as a child process, ``posttrain serve-retriever`` runs it
from the shell.
"""

from posttrain.agents.retriever.client import Health, RetrieverClient
from posttrain.agents.retriever.corpus import CorpusError, load_corpus
from posttrain.agents.retriever.index import INDEX_KINDS, BM25Index, DenseIndex, SearchIndex, build_index
from posttrain.agents.retriever.process import RetrieverProcess
from posttrain.agents.retriever.service import ServeError, create_app, serve
from posttrain.agents.retriever.types import Document, Hit, RetrieverError

__all__ = [
    "BM25Index", "CorpusError", "DenseIndex", "Document", "Health", "Hit", "INDEX_KINDS", "RetrieverClient",
    "RetrieverError", "RetrieverProcess", "SearchIndex", "ServeError", "build_index", "create_app", "load_corpus", "serve",
]
