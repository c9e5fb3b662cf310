"""An agent program's episode: the chat requests a user's own program sends to the run's
OpenAI-compatible endpoint (rollout/endpoint.py), recorded token by token and stitched into samples.

Each request is answered by one engine call, and what the engine saw and sampled is kept: the
context's token ids, the sampled ids, their logprobs and the weight version. Requests are compared as
messages: role, content, and tool calls (name and arguments as JSON) as they were returned; nothing
else of a message counts (ids, ``refusal``, an SDK's other fields).

- **Extension.** A request with the same ``tools`` whose messages are the previous request's messages, then
  the reply it got, then new messages (tool results, a user turn) continues the same sample. Its context is the sample's
  tokens so far (the prompt, each sampled turn and each rendered message, never re-tokenised), then
  only the new messages as the chat template renders them (agents/render.py ``render_turns``), then
  the assistant header. The sampled turns are trained (loss mask 1), the rendered messages are not.
- **Prefix break.** Any other request (history edited or trimmed, other tools) starts a new sample of the
  same episode, its prompt rendered
  from the request's messages and tools as a dataset prompt is (``tokenize_prompts``); an assistant
  message this endpoint returned is rendered as the text the model wrote. The samples share the
  episode's reward; ``prefix_breaks`` counts them.

Tool messages that answer one reply are rendered as the tool agent renders a turn's results: one
message in the run's tool format's role, its text the format's ``observation`` of ``(name, content)``
per call in the order of the calls, whatever the order of the messages (names from the reply's calls by
``tool_call_id``). So a program and ``env.name=tools`` show the model the same tokens (a long result is
not cut here, as the tool agent cuts it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.agents.loop import Episode, TurnOutput, turn_logprobs
from posttrain.agents.render import render_turns
from posttrain.errors import InputError
from posttrain.models import tokenize_prompts
from posttrain.models.tool_formats import ToolFormat

MessageKey = tuple[str, str, tuple[tuple[str, str], ...]]


class ContextFull(InputError):
    """A request that no longer fits the episode's response budget (``data.max_response_length``)."""


def _arguments(value: Any) -> str:
    """Arguments as canonical JSON text (a string that is not JSON stays as it is)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def message_key(message: Any) -> MessageKey:
    """What two messages must share to be the same: role, content and tool calls (module docstring)."""
    role, content = _field(message, "role"), _field(message, "content")
    if not isinstance(role, str):
        raise InputError(f"a message has no role: {str(message)[:200]}")
    if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
        content = "".join(str(_field(part, "text") or "") for part in content)
    calls = []
    for call in _field(message, "tool_calls") or ():
        function = _field(call, "function") or {}
        calls.append((str(_field(function, "name")), _arguments(_field(function, "arguments"))))
    return role, "" if content is None else str(content), tuple(calls)


@dataclass(frozen=True)
class Reply:
    """One answered request: the message returned, and the text the model sampled for it."""

    message: dict[str, Any]
    text: str
    finish_reason: str  # stop | tool_calls | length


class ProgramEpisode:
    """One run of a program on one row: its samples, stitched from its requests (module docstring)."""

    def __init__(self, tokenizer: Any, tool_format: ToolFormat, max_response_length: int, key: str = "") -> None:
        self.tokenizer, self.tool_format, self.max_response_length = tokenizer, tool_format, max_response_length
        self.key = key  # as the agent loop's sampling key: with the number of replies so far, it seeds each request
        self.samples: list[Episode] = []
        self.prefix_breaks = 0
        self.requests = 0
        self.malformed_turns = 0  # replies with a call begun and not read (none read: the text comes back as the content)
        self.oldest_version: int | None = None  # the oldest weight version any reply came from (async staleness)
        self._seen: list[MessageKey] | None = None  # the last request's messages, then its reply
        self._pending: tuple[list[MessageKey], Episode | None, list[int]] | None = None  # context() given, record() not yet
        self._last_reply: Reply | None = None
        self._sampled_text: dict[MessageKey, str] = {}  # each reply returned -> the text the model wrote for it

    def context(self, messages: Sequence[Any], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The token ids the engine continues for this request (extending the last sample, or a new one).
        Nothing is kept until :meth:`record`: a request that fails leaves the episode as it was."""
        if not messages:
            raise InputError("a chat request needs at least one message")
        keys = [message_key(message) for message in messages] + [("tools", _arguments(list(tools or ())), ())]
        seen = self._seen
        # the same tools, the same messages, then the reply, then new ones: an extension
        if seen is not None and keys[-1] == seen[0] and len(keys) - 1 > len(seen) - 1 and keys[:len(seen) - 1] == seen[1:]:
            sample = self.samples[-1]
            calls = self._last_reply.message.get("tool_calls") or [] if self._last_reply else []
            turns = self._as_turns(messages[len(seen) - 1:], calls)
            ids = render_turns(self.tokenizer, turns, after_token=sample.response_ids[-1])
            if len(ids) >= sample.room:
                raise ContextFull(f"the conversation is {len(sample.context) + len(ids)} tokens; the run's budget after "
                                  f"the prompt is data.max_response_length={self.max_response_length}")
            self._pending = (keys, None, ids)
            return sample.context + ids
        turns = self._as_turns(messages, [])
        prompt = tokenize_prompts([[{"role": role, "content": "".join(text)} for role, text in turns]], self.tokenizer,
                                  tools=list(tools or ()) or None, tool_format=self.tool_format)[0]
        fresh = Episode(prompt_ids=list(prompt), turn_budget=0, response_budget=self.max_response_length)
        self._pending = (keys, fresh, [])
        return fresh.context

    @property
    def room(self) -> int:
        """New tokens the request given to :meth:`context` can take."""
        if self._pending is None:
            raise RuntimeError("room is the pending request's: call context() first")
        keys, fresh, ids = self._pending
        return fresh.room if fresh is not None else self.samples[-1].room - len(ids)

    def record(self, turn: TurnOutput, tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        """Keep the request's context and the engine's turn, and return the reply in OpenAI's shape. All
        that can fail (the logprobs, decoding, reading the calls) happens before anything is kept."""
        if self._pending is None:
            raise RuntimeError("record() answers the request context() was given: call context() first")
        keys, fresh, ids = self._pending
        kept = list(turn.token_ids[: self.room])
        turn_logprobs(kept, turn.logprobs)  # refused here, before anything is kept
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        parsed = self.tool_format.parse(text, list(tools or ()) or None) if tools else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason = "length" if turn.finish_reason == "length" or len(kept) < len(turn.token_ids) else "stop"
        if parsed is not None and parsed.calls:
            message["content"] = parsed.content.strip() or None
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}} for call in parsed.calls]
            reason = "tool_calls" if reason == "stop" else reason
        self.malformed_turns += int(parsed is not None and parsed.malformed > 0)
        if fresh is not None:
            self.prefix_breaks += int(self._seen is not None)
            self.samples.append(fresh)
        sample = self.samples[-1]
        sample.append_observation(ids)
        sample.append_agent_turn(turn)
        sample.done = reason != "length"  # its finish reason, as the batch reports it: stop, or cut at the budget
        sample.actions.append(text)
        self.requests += 1
        self.oldest_version = turn.weight_version if self.oldest_version is None else min(self.oldest_version, turn.weight_version)
        key = message_key(message)
        self._sampled_text[key] = text
        self._seen, self._pending = [keys[-1], *keys[:-1], key], None  # the tools first, then the messages and the reply
        self._last_reply = Reply(message, text, reason)
        return self._last_reply

    @property
    def last_reply(self) -> Reply | None:
        """The last request's reply (None before the first)."""
        return self._last_reply

    def transcript(self) -> list[dict[str, Any]]:
        """The episode as chat messages: its last request's messages, then the reply they got (what
        validation's episode files and the report's samples show); [] before the first request."""
        if self._seen is None:
            return []
        messages = []
        for role, content, calls in self._seen[1:]:
            message: dict[str, Any] = {"role": role, "content": content}
            if calls:
                message["tool_calls"] = [{"name": name, "arguments": arguments} for name, arguments in calls]
            messages.append(message)
        return messages

    def _as_turns(self, messages: Sequence[Any], calls: Sequence[dict[str, Any]]) -> list[tuple[str, str | tuple[str, ...]]]:
        """Messages as (role, text) turns for the template: a reply this endpoint returned as the text the
        model wrote; each run of tool messages as one observation in the tool format's role, the results in
        the order of the calls they answer (``calls``: the reply before them, where it is not among
        ``messages``), each named by its call's id (else by its place). A user message right after the results,
        where the observation is a user turn, joins it on a line of its own, tokenised apart (pieces), as the
        built-in agent appends its final-turn instruction (agents/render.py)."""
        turns: list[tuple[str, str | tuple[str, ...]]] = []
        results: list[tuple[int, str, str]] = []  # (the call's place, its name, the result)
        last_calls = list(calls)

        def flush() -> None:
            if results:
                ordered = [(name, text) for _, name, text in sorted(results, key=lambda r: r[0])]
                turns.append((self.tool_format.observation_role, self.tool_format.observation(ordered)))
                results.clear()

        for message in messages:
            key = message_key(message)
            role, content, _ = key
            if role == "tool":
                call_id = _field(message, "tool_call_id")
                place = next((i for i, call in enumerate(last_calls) if _field(call, "id") == call_id), len(results))
                name = str(_field(_field(last_calls[place], "function") or {}, "name")) if place < len(last_calls) else "tool"
                results.append((place, name, content))
                continue
            observed = bool(results)
            flush()
            if observed and role == "user" == self.tool_format.observation_role:
                last = turns[-1][1]
                turns[-1] = (role, (last, "\n" + content) if content and last else last or content)
                continue
            if role == "assistant":
                last_calls = list(_field(message, "tool_calls") or ())
                content = self._sampled_text.get(key, content)
            turns.append((role, content))
        flush()
        return turns
