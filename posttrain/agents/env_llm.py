"""The environment's language model: what a patient, a simulated user or a judge speaks through.

An environment that needs a model on the other side of the conversation asks for the ``env_llm``
resource (a constructor parameter of that name; see ``registry.py``) and calls

    replies = env_llm.chat([messages_1, messages_2, ...])   # one batched request per agent-loop round

with chat messages in and one :class:`EnvLLMReply` per conversation out (text, finish reason, token
counts). Two backends implement :class:`EnvLLMClient`:

- the in-cluster Env-LLM worker (``workers/env_llm.py``, the default; its client lives with the
  trainer, ``rollout/env_llm.py``), a frozen model served by the rollout engine;
- :class:`OpenAIChatClient`, any OpenAI-compatible chat server at ``env.llm.url`` (e.g. a
  ``vllm serve`` the user already runs): one ``POST /v1/chat/completions`` per conversation, sent
  concurrently.

Failures are per conversation: a reply that could not be had comes back as an :class:`EnvLLMReply`
with ``finish_reason="error"`` (and the reason in ``error``), so one bad conversation never costs the
others their replies; the environment decides what it means for its episode (the doctor ends it and
counts it). The HTTP backend retries a timeout, a transport error, a 5xx, 408 or 429 ``retries`` times
(backoff ``backoff_s``, doubling) and gives up on other 4xx at once; every attempt has a timeout, so
nothing hangs. The in-cluster worker is part of the run: a worker that dies or raises stops the run
with its own error (``WorkerDiedError`` names the role), as every other role does. :meth:`EnvLLMClient.check`
asks for one reply when the run opens, so a wrong URL or model name fails before training, with the fix.

Every client keeps :class:`EnvLLMStats` (requests, conversations, seconds spent waiting, tokens);
the trainer drains them once per rollout as ``env_llm/*`` metrics (:meth:`EnvLLMClient.drain_metrics`).

Replay (:class:`ReplyCache`, ``env.llm.reply_cache``): a SQLite file of replies keyed by the model,
the sampling settings and the whole conversation. A conversation asked before gets its stored reply
and never reaches the model, so an evaluation run again with the same file sees exactly the replies
of the first, on any machine and in any batch order; only new conversations are generated (and
stored). Failed replies are not stored. The model's identity includes the size and time of its
weight files, so a patient retrained in the same directory does not replay the old one's replies.
The Env-LLM's sampling is seeded (``trainer.seed``) and greedy by default, so a run made twice
gets the same replies without a cache too; at a temperature above 0 a reply also depends on the
batch it was sampled in, which the cache removes.
"""

from __future__ import annotations

import abc
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import httpx

from posttrain.errors import InputError, PosttrainError
from posttrain.metrics import Metrics, mean, total

Messages = Sequence[dict[str, str]]


@dataclass(frozen=True)
class EnvLLMReply:
    text: str
    finish_reason: str  # "stop" | "length" | "error" (no reply; see ``error``)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.finish_reason == "error"


class EnvLLMError(PosttrainError):
    """The environment's model did not answer; ``retryable`` is False for a request it refused (4xx).
    Exit code 2: a service to fix (its URL, its model, its key)."""

    exit_code = 2

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class EnvLLM(Protocol):
    """What an environment needs of its model (either backend, or a test's fake)."""

    def chat(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]: ...


@dataclass
class EnvLLMStats:
    """Usage since the last drain: what ``env_llm/*`` metrics report per rollout."""

    requests: int = 0          # batched calls (one per agent-loop round that needed the model)
    conversations: int = 0     # replies asked for
    failures: int = 0          # calls that failed after every retry
    retries: int = 0
    seconds: float = 0.0       # wall time spent waiting for replies
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: int = 0            # replies read from the reply cache (env.llm.reply_cache), not generated
    first_error: str = ""      # of the first failed reply (not a metric: the trainer's circuit breaker quotes it)

    def metrics(self, prefix: str = "env_llm") -> Metrics:
        """The counts as metrics named ``<prefix>/...`` (a judge's client reports as ``judge/``)."""
        metrics = {
            "requests": total(self.requests), "replies": total(self.conversations),
            "failures": total(self.failures), "retries": total(self.retries),
            "wait_s": total(self.seconds),
            "latency_s": mean(self.seconds / self.requests if self.requests else 0.0, self.requests),  # per batched call
            "prompt_tokens": total(self.prompt_tokens), "completion_tokens": total(self.completion_tokens),
            "cached_replies": total(self.cached),
        }
        return {f"{prefix}/{name}": metric for name, metric in metrics.items()}


class EnvLLMClient(abc.ABC):
    """Timing and usage around one backend's batched request (:meth:`_request`)."""

    def __init__(self) -> None:
        self.stats = EnvLLMStats()
        self.cache: ReplyCache | None = None  # set by the caller (env.llm.reply_cache)
        self.metric_prefix = "env_llm"  # its metrics' names: env_llm/..., or judge/... for a judge's client

    def chat(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]:
        """One reply per conversation, in order (a failed one has ``finish_reason="error"``)."""
        if not conversations:
            return []
        stored = self.cache.get_many(conversations) if self.cache is not None else [None] * len(conversations)
        missing = [c for c, reply in zip(conversations, stored) if reply is None]
        new = self._timed_request(missing) if missing else []
        if self.cache is not None:
            self.cache.put_many(missing, new)
        fresh = iter(new)
        replies = [reply if reply is not None else next(fresh) for reply in stored]
        self.stats.cached += len(conversations) - len(missing)
        self.stats.conversations += len(replies)
        self.stats.failures += sum(r.failed for r in replies)
        self.stats.first_error = self.stats.first_error or next((r.error or "no reason given" for r in replies if r.failed), "")
        self.stats.prompt_tokens += sum(r.prompt_tokens for r in new)  # what the model processed
        self.stats.completion_tokens += sum(r.completion_tokens for r in new)
        return replies

    def _timed_request(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]:
        start = time.perf_counter()
        try:
            replies = self._request(conversations)
        finally:
            self.stats.seconds += time.perf_counter() - start
            self.stats.requests += 1
        if len(replies) != len(conversations):
            raise EnvLLMError(f"{self.describe()} returned {len(replies)} replies for {len(conversations)} conversations")
        return replies

    def check(self) -> None:
        """Ask for one short reply; raise :class:`EnvLLMError` (with the fix) when none comes."""
        (reply,) = self.chat([[{"role": "user", "content": "Say OK."}]])
        if reply.failed:
            raise EnvLLMError(f"the environment's model does not answer: {reply.error}")
        self.drain_metrics()  # the probe is not the run's usage

    @abc.abstractmethod
    def _request(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]:
        """A reply for every conversation (failed ones as error replies)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the model is, for messages (``the Env-LLM worker``, ``http://...``)."""

    def drain_metrics(self) -> Metrics:
        """``env_llm/*`` (or ``<metric_prefix>/*``) metrics of the usage since the last drain; starts counting anew."""
        metrics, self.stats = self.stats.metrics(self.metric_prefix), EnvLLMStats()
        return metrics

    def close(self) -> None:
        """Release connections (and the reply cache)."""
        if self.cache is not None:
            self.cache.close()


class OpenAIChatClient(EnvLLMClient):
    """An OpenAI-compatible chat server (``/v1/chat/completions``), e.g. ``vllm serve MODEL``."""

    def __init__(
        self, url: str, model: str, *, temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 64, timeout_s: float = 60.0,
        retries: int = 2, backoff_s: float = 0.5, concurrency: int = 16, api_key: str | None = None,
    ) -> None:
        super().__init__()
        if retries < 0:
            raise InputError(f"env.llm.retries={retries} must be >= 0")
        self.retries, self.backoff_s = retries, backoff_s
        base = url.rstrip("/")
        for suffix in ("/chat/completions", "/v1"):
            base = base.removesuffix(suffix)
        self.url, self.model = base, model
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency))

    def describe(self) -> str:
        return f"the chat server at {self.url}"

    def _request(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]:
        return list(self._pool.map(self._one_with_retries, conversations))

    def _one_with_retries(self, messages: Messages) -> EnvLLMReply:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return self._one(messages)
            except EnvLLMError as error:
                if not error.retryable or attempt == self.retries:
                    return EnvLLMReply("", "error", error=str(error))
            self.stats.retries += 1
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _one(self, messages: Messages) -> EnvLLMReply:
        body = {"model": self.model, "messages": list(messages), "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens}
        try:
            response = self._http.post("/v1/chat/completions", json=body)
        except httpx.TimeoutException as error:
            raise EnvLLMError(f"{self.describe()} did not answer within env.llm.timeout_s={self.timeout_s:g}s") from error
        except httpx.TransportError as error:
            raise EnvLLMError(
                f"cannot reach {self.describe()} ({type(error).__name__}); start it (e.g. `vllm serve MODEL`) "
                "or unset env.llm.url to serve the model in the cluster"
            ) from error
        if response.status_code >= 400:
            raise EnvLLMError(
                f"{self.describe()} answered HTTP {response.status_code} (check env.llm.api_model and the server's "
                f"API key, env.llm.api_key_env): {response.text[:300]}",
                retryable=response.status_code >= 500 or response.status_code in (408, 429),
            )
        try:
            data = response.json()
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            return EnvLLMReply(
                str(choice["message"]["content"] or ""), "length" if choice.get("finish_reason") == "length" else "stop",
                int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
            )
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise EnvLLMError(f"{self.describe()} answered in an unexpected shape: {response.text[:300]}") from error

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()
        super().close()


class ReplyCache:
    """Stored replies by (model, sampling settings, conversation), in a SQLite file (module docstring).

    ``identity`` names the model and how it samples (``model_identity``); conversations are keyed
    by the SHA-256 of it and the messages. Safe to share between processes (SQLite's locking).
    """

    def __init__(self, path: str | Path, identity: dict) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._identity = json.dumps(identity, sort_keys=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
            self._db.commit()
        except sqlite3.DatabaseError as error:
            raise InputError(f"env.llm.reply_cache={self.path} is not a reply cache SQLite can open ({error}); "
                             "give a new file's path") from error

    def key(self, messages: Messages) -> str:
        text = json.dumps([self._identity, [dict(m) for m in messages]], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def get_many(self, conversations: Sequence[Messages]) -> list[EnvLLMReply | None]:
        keys = [self.key(c) for c in conversations]
        with self._lock:
            found = dict(self._db.execute(
                f"SELECT key, reply FROM replies WHERE key IN ({','.join('?' * len(keys))})", keys
            ).fetchall())
        return [EnvLLMReply(**json.loads(found[k])) if k in found else None for k in keys]

    def put_many(self, conversations: Sequence[Messages], replies: Sequence[EnvLLMReply]) -> None:
        rows = [(self.key(c), json.dumps(asdict(r))) for c, r in zip(conversations, replies) if not r.failed]
        if rows:
            with self._lock:
                self._db.executemany("INSERT OR REPLACE INTO replies VALUES (?, ?)", rows)
                self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def model_identity(model: str, **sampling) -> dict:
    """What a stored reply depends on: the model (a local directory: its weight and config files'
    names, sizes and times; else the name or URL as given) and the sampling settings."""
    path = Path(model)
    files = []
    if path.is_dir():
        files = sorted(
            (f.name, f.stat().st_size, int(f.stat().st_mtime))
            for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".json", ".gguf") and f.is_file()
        )
    return {"model": str(model), "files": files, **sampling}
