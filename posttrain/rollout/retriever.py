"""The retriever a search environment talks to during a run: a given URL, or a service started for it.

``env.retriever.url`` set: connect, check ``/health`` once, and fail early with the fix when it is
down (or refuses the token). Unset: start ``posttrain serve-retriever`` on 127.0.0.1 over
``env.retriever.corpus`` (by default the ``corpus.jsonl`` beside the training data, which
``posttrain prepare synthetic-search`` writes) and stop it when the run ends.

The token is the value of the environment variable ``env.retriever.token_env`` names
(``POSTTRAIN_RETRIEVER_TOKEN`` by default), read in each process that opens the retriever; unset or
empty, no token is sent. A service started for the run is given the same token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from posttrain.agents.retriever import RetrieverClient, RetrieverError, RetrieverProcess
from posttrain.config.schema import RetrieverConfig
from posttrain.data.preparers.synthetic_search import CORPUS_FILE
from posttrain.errors import InputError, ServiceDiedError


@dataclass
class RetrieverHandle:
    client: RetrieverClient
    process: RetrieverProcess | None = None

    def check_alive(self) -> None:
        """A service started for the run that has exited raises :class:`ServiceDiedError` (a restart
        starts it again); a service at a URL is not the run's to judge: its failures are counted."""
        code = self.process.exit_code() if self.process is not None else None
        if code is not None:
            raise ServiceDiedError(f"the retriever the run started ({self.process.url}) exited with code {code}; the end of its log "
                                   f"{self.process.log_path}: {self.process.log_tail()[-500:]!r}.")

    def close(self) -> None:
        self.client.close()
        if self.process is not None:
            self.process.stop()


def corpus_path(config: RetrieverConfig, data_dir: Path | None) -> Path:
    """The corpus a started service serves: env.retriever.corpus, or corpus.jsonl beside the data."""
    corpus = Path(config.corpus) if config.corpus else (data_dir / CORPUS_FILE if data_dir else None)
    if corpus is None or not corpus.is_file():
        raise InputError(
            f"the search environment needs a retriever: no service at env.retriever.url and no corpus at "
            f"{corpus or 'env.retriever.corpus'}; set env.retriever.corpus=PATH.jsonl (lines {{\"id\", \"contents\"}}) "
            "or env.retriever.url=http://HOST:PORT of a running `posttrain serve-retriever`"
        )
    return corpus


def retriever_token(config: RetrieverConfig) -> str | None:
    """The token in the variable env.retriever.token_env names; None when unset or empty."""
    return (os.environ.get(config.token_env) or None) if config.token_env else None


def open_retriever(config: RetrieverConfig, data_dir: Path | None) -> RetrieverHandle:
    token = retriever_token(config)
    if config.url:
        client = RetrieverClient(config.url, timeout_s=config.timeout_s, retries=config.retries, token=token)
        try:
            client.health()
        except RetrieverError:
            client.close()
            raise
        return RetrieverHandle(client)
    corpus = corpus_path(config, data_dir)
    process = RetrieverProcess(corpus, config.index, port=config.port, startup_timeout_s=config.startup_timeout_s, token=token)
    print(f"posttrain: retriever ({config.index}) over {corpus} at {process.url}")
    client = RetrieverClient(process.url, timeout_s=config.timeout_s, retries=config.retries, token=token)
    return RetrieverHandle(client, process)
