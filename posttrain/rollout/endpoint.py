"""The run's OpenAI-compatible endpoint: a user's own agent program talks to the rollout engine through
it, and every token the engine saw and sampled is recorded (agents/program.py).

    endpoint = ProgramEndpoint(generate, tokenizer, tool_format, EndpointSettings(model="policy", ...))
    with endpoint.serving():
        base_url = endpoint.open("row3-0")     # http://127.0.0.1:PORT/episodes/row3-0/v1
        ...                                    # the program: openai.OpenAI(base_url=base_url, api_key="-")
        episode = endpoint.close("row3-0")     # its samples, stitched from its requests

Served per episode: ``POST /episodes/<key>/v1/chat/completions`` (``messages``, ``tools``, ``tool_choice``
auto or none, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``logprobs``, ``n=1``) and
``GET /episodes/<key>/v1/models``. A prompt is rendered as the tool agent renders its prompts (the run's
tool format; ``tools`` told in it), and a reply's calls are read by that format and returned in OpenAI's
shape (``tool_calls``, ``finish_reason: tool_calls``).

**Sampling is the run's.** Temperature and the other sampling settings come from the rollout config; a
request that asks for others (``temperature``, ``top_p``, ``seed``, ...) or names another model is
served with the run's settings and counted (``program/sampling_ignored``), or refused with a 400 when
``refuse_other_sampling`` is set; ``n`` other than 1 is always refused (each sample of a group is its own
run of the program). ``max_tokens`` can only lower the run's ``env.max_turn_tokens``, and what is left of
the episode's ``data.max_response_length``.

**Gathered into one engine call.** Requests wait until every open episode has one waiting (an episode is
closed as its program ends) or none has come for ``gather_s``, and go to the engine as one call, as the
agent loop's turns do; requests with other ``max_tokens`` or ``stop`` go in calls of their own. Each
request is sampled under its own key, the episode's seed key and its turn (as the agent loop names its
requests), so the sampled tokens do not depend on which requests a call gathered. A request
whose episode was closed meanwhile (its program stopped at the deadline) never reaches the engine, and
``idle`` is set while no engine call is under way: the rollout closes its episodes, then waits for it, so
no call wakes the engine after the rollout let it sleep.

Refused with an OpenAI-shaped error (``program/refused``): a request for an episode that is not open
(never opened, or closed, also while its request was with the engine: nothing more is recorded), 404; a
second request of an episode while its first is under way, 409 (a conversation is a sequence); ``stream``,
a ``tool_choice`` other than auto or none, a malformed field, messages the template cannot render, a
prompt past ``max_context_tokens`` or a conversation past the response budget, 400. A request the engine
failed under gets a 500 (``program/engine_errors``): a call that fails is tried again one request at a
time, so one bad context fails only itself, and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from posttrain.agents import GenerateTurn, TurnOutput
from posttrain.agents.program import ContextFull, ProgramEpisode
from posttrain.errors import PosttrainError
from posttrain.models.tool_formats import ToolFormat

# request fields that ask for sampling other than the run's (served with the run's, and counted)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "min_p")
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EndpointSettings:
    model: str                      # the name /v1/models lists and a request may ask for
    max_turn_tokens: int            # new tokens per request at most (env.max_turn_tokens)
    max_response_length: int        # tokens after an episode's first prompt (data.max_response_length)
    gather_s: float = 0.25          # the quiet time after the last request that ends the wait for the other open episodes'
    refuse_other_sampling: bool = False
    max_context_tokens: int | None = None  # the engine's context (max_model_len): a longer prompt is a 400, not an engine error
    host: str = "127.0.0.1"


class RequestError(PosttrainError):
    """A request answered with an OpenAI-shaped error and ``status`` (never raised past the endpoint);
    a message alone is a 400."""

    def __init__(self, status: int | str, message: str = "", code: str = "invalid_request") -> None:
        if isinstance(status, str):
            status, message = 400, status
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.status, self.message, self.code)


@dataclass
class _Waiting:
    key: str
    episode: ProgramEpisode
    context: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    future: asyncio.Future = field(repr=False)


class ProgramEndpoint:
    """Serves ``generate`` (the agent loop's engine call) to programs, one base URL per episode."""

    def __init__(self, generate: GenerateTurn, tokenizer: Any, tool_format: ToolFormat, settings: EndpointSettings) -> None:
        self.generate, self.tokenizer, self.tool_format, self.settings = generate, tokenizer, tool_format, settings
        self.episodes: dict[str, ProgramEpisode] = {}
        self.counts: dict[str, float] = defaultdict(float)  # program/* counters
        self.port: int | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[_Waiting] = []
        self._busy: set[int] = set()  # episodes (by identity) with a request under way
        self._gatherer: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._arrived = 0.0  # the event loop's time of the last request
        self.idle = threading.Event()  # no engine call under way (the rollout waits for it before the engine may sleep)
        self.idle.set()

    # episodes -----------------------------------------------------------------------------------

    def open(self, key: str, seed_key: str | None = None) -> str:
        """Start recording episode ``key``; its base URL. Its requests are sampled under ``"<seed_key>:<turn>"``
        (default ``key``), as the agent loop's episode of that key would be."""
        if self.port is None:
            raise RuntimeError("the endpoint is not serving: open episodes inside `with endpoint.serving():`")
        with self._lock:
            if key in self.episodes:
                raise ValueError(f"episode {key!r} is already open")
            self.episodes[key] = ProgramEpisode(self.tokenizer, self.tool_format, self.settings.max_response_length,
                                                key if seed_key is None else seed_key)
        return f"http://{self.settings.host}:{self.port}/episodes/{key}/v1"

    def close(self, key: str) -> ProgramEpisode:
        """Stop episode ``key`` (later requests are refused) and return what it recorded."""
        with self._lock:
            return self.episodes.pop(key)

    def drain_counts(self) -> dict[str, float]:
        """The ``program/*`` counters since the last call, and start again from 0."""
        drained, self.counts = dict(self.counts), defaultdict(float)
        return drained

    # serving ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def serving(self) -> Iterator[ProgramEndpoint]:
        """Serve on a free port in a thread of this process until the block ends."""
        import uvicorn

        sock = socket.socket()
        sock.bind((self.settings.host, 0))
        server = uvicorn.Server(uvicorn.Config(self.app(), log_level="critical", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="program-endpoint", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the program endpoint did not start")
            time.sleep(0.01)
        self.port = sock.getsockname()[1]
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=START_TIMEOUT_S)
            sock.close()
            self.port = None

    def app(self) -> FastAPI:
        app = FastAPI(title="posttrain program endpoint")

        def error(problem: RequestError) -> JSONResponse:
            self.counts["program/refused" if problem.status < 500 else "program/engine_errors"] += 1
            return JSONResponse({"error": {"message": problem.message, "type": "invalid_request_error", "code": problem.code}},
                                status_code=problem.status)

        @app.get("/episodes/{key}/v1/models")
        async def models(key: str) -> Any:
            return {"object": "list", "data": [{"id": self.settings.model, "object": "model", "created": 0, "owned_by": "posttrain"}]}

        @app.post("/episodes/{key}/v1/chat/completions")
        async def chat(key: str, request: Request) -> Any:
            try:
                body = await request.json()
            except ValueError as problem:
                return error(RequestError(400, f"the request body is not JSON ({problem})"))
            try:
                if not isinstance(body, dict):
                    raise RequestError(400, "the request body is a JSON object with messages")
                return await self._complete(key, body)
            except RequestError as problem:
                return error(problem)
            except Exception as problem:  # the engine failed under the request: the program sees a 500, the run goes on
                return error(RequestError(500, f"the rollout engine failed: {type(problem).__name__}: {problem}", "engine_error"))

        return app

    async def _complete(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        episode = self.episodes.get(key)
        if episode is None:
            raise RequestError(404, f"episode {key!r} is not open (it ended, or was never started)", "episode_not_open")
        if id(episode) in self._busy:
            raise RequestError(409, f"episode {key!r} has a request under way; send one request at a time per episode "
                                    "(a conversation is a sequence)", "request_under_way")
        options = self._options(body)
        self._busy.add(id(episode))
        try:
            return await self._answer(key, episode, body, options)
        finally:
            self._busy.discard(id(episode))

    async def _answer(self, key: str, episode: ProgramEpisode, body: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        tools = options["tools"]
        try:
            context = episode.context(body.get("messages") or [], tools)
        except ContextFull as problem:
            self.counts["program/context_full"] += 1
            raise RequestError(400, str(problem), "context_length_exceeded") from None
        except Exception as problem:  # a message the template or the tool format cannot render
            raise RequestError(400, f"the request cannot be rendered: {type(problem).__name__}: {problem}") from None
        limit = self.settings.max_context_tokens
        if limit is not None and len(context) >= limit:
            self.counts["program/context_full"] += 1
            raise RequestError(400, f"the prompt is {len(context)} tokens; the engine's context holds {limit}", "context_length_exceeded")
        max_tokens = min(options["max_tokens"], episode.room)
        loop = asyncio.get_running_loop()
        waiting = _Waiting(key, episode, context, max_tokens, options["stop"], loop.create_future())
        self._enqueue(waiting)
        turn: TurnOutput = await waiting.future
        with self._lock:  # the controller may close the episode meanwhile: then nothing more is recorded
            if self.episodes.get(key) is not episode:
                raise RequestError(404, f"episode {key!r} ended while its request was answered", "episode_not_open")
            reply = episode.record(turn, tools)
        kept = episode.samples[-1].last_turn_ids
        message = dict(reply.message)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
        if body.get("logprobs"):
            pieces = [self.tokenizer.decode([token]) for token in kept]
            choice["logprobs"] = {"content": [{"token": piece, "logprob": float(logprob), "bytes": list(piece.encode()), "top_logprobs": []}
                                              for piece, logprob in zip(pieces, turn.logprobs)]}
        self.counts["program/requests"] += 1
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.settings.model, "choices": [choice],
                "usage": {"prompt_tokens": len(context), "completion_tokens": len(kept), "total_tokens": len(context) + len(kept)}}

    def _options(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request's tools, max_tokens and stop strings; other sampling counted or refused (module docstring)."""
        if body.get("n") not in (None, 1):
            raise RequestError(400, f"n={body.get('n')}: this endpoint answers n=1 (each sample of a group is its own run of "
                                    "the program)", "unsupported_n")
        if body.get("stream"):
            raise RequestError(400, "stream=true: this endpoint answers whole replies; leave stream unset", "unsupported_stream")
        choice = body.get("tool_choice", "auto")
        if choice not in (None, "auto", "none"):
            raise RequestError(400, f"tool_choice={choice!r}: this endpoint follows the model's own choice (auto) or none",
                               "unsupported_tool_choice")
        other = [name for name in SAMPLING_FIELDS if body.get(name) is not None]
        if body.get("model") not in (None, self.settings.model):
            other.append(f"model={body.get('model')!r}")
        if other:
            if self.settings.refuse_other_sampling:
                raise RequestError(400, f"{', '.join(other)}: the run samples with its own settings (rollout config) and "
                                        f"serves model {self.settings.model!r}; drop these fields", "sampling_refused")
            self.counts["program/sampling_ignored"] += 1
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.settings.max_turn_tokens
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise RequestError(400, f"max_tokens={asked!r} must be a positive integer")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(text, str) for text in stop):
            raise RequestError(400, f"stop={body.get('stop')!r} must be a string or a list of strings")
        tools = body.get("tools") if choice != "none" else None
        if tools is not None and not isinstance(tools, list):
            raise RequestError(400, "tools must be a list of tool schemas")
        return {"max_tokens": min(asked, self.settings.max_turn_tokens), "stop": tuple(stop), "tools": tools}

    # gathering ----------------------------------------------------------------------------------

    def _enqueue(self, waiting: _Waiting) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._gatherer is None or self._gatherer.done():
            self._loop, self._wake = loop, asyncio.Event()
            self._gatherer = loop.create_task(self._gather())
        self._waiting.append(waiting)
        self._arrived = loop.time()
        self._wake.set()

    async def _gather(self) -> None:
        """Forever: wait for a request, let others join it, send them to the engine as one call per shape."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            # until every open episode has a request waiting, or none has come for gather_s (counted from
            # now at the latest: requests that queued during the last engine call wait for its episodes too)
            self._arrived = max(self._arrived, loop.time())
            while len(self._waiting) < len(self.episodes) and loop.time() - self._arrived < self.settings.gather_s:
                await asyncio.sleep(min(0.002, self.settings.gather_s))
            taken, self._waiting = self._waiting, []
            self._wake.clear()
            self.idle.clear()  # before the episodes are looked at: whoever closes them and then waits for idle is safe
            shapes: dict[tuple[int, tuple[str, ...]], list[_Waiting]] = defaultdict(list)
            for waiting in taken:
                if waiting.future.done():  # a program that went away leaves a cancelled request
                    continue
                with self._lock:
                    ended = self.episodes.get(waiting.key) is not waiting.episode
                if ended:  # its program was stopped (the deadline): never to the engine
                    waiting.future.set_exception(RequestError(404, f"episode {waiting.key!r} ended", "episode_not_open"))
                    continue
                shapes[(waiting.max_tokens, waiting.stop)].append(waiting)
            try:
                for (max_tokens, stop), members in shapes.items():
                    await self._call_engine(members, max_tokens, stop)
            finally:
                self.idle.set()

    async def _call_engine(self, members: list[_Waiting], max_tokens: int, stop: tuple[str, ...]) -> None:
        """One engine call for ``members``; if it fails, each again alone, so that one bad context fails only itself."""
        loop = asyncio.get_running_loop()
        try:
            request_keys = [f"{m.episode.key}:{m.episode.requests}" for m in members]  # its turn: the replies before it
            outputs = await loop.run_in_executor(None, self.generate, [m.context for m in members], max_tokens, stop, request_keys)
            if len(outputs) != len(members):
                raise RuntimeError(f"the engine returned {len(outputs)} turns for {len(members)} contexts")
        except Exception as problem:
            if len(members) > 1:
                for member in members:
                    await self._call_engine([member], max_tokens, stop)
                return
            outputs, failure = None, problem
        for index, member in enumerate(members):
            if member.future.done():
                continue
            if outputs is None:
                member.future.set_exception(failure)
            else:
                member.future.set_result(outputs[index])


def episode_counts(episodes: Sequence[ProgramEpisode]) -> dict[str, float]:
    """``program/samples_per_episode``, ``program/prefix_breaks`` and ``program/malformed_turns`` (replies with a
    call begun and not read, which the built-in tool agent would answer with an error), per episode."""
    if not episodes:
        return {}
    return {"program/samples_per_episode": sum(len(e.samples) for e in episodes) / len(episodes),
            "program/prefix_breaks": sum(e.prefix_breaks for e in episodes) / len(episodes),
            "program/malformed_turns": sum(e.malformed_turns for e in episodes) / len(episodes)}
