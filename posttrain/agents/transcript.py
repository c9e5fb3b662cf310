"""A whole conversation in tokens, laid out exactly as the agent loop lays out an episode.

Supervised fine-tuning before RL must teach the tokens the agent loop will later feed the model,
so a transcript is tokenised piece by piece with the loop's own rules (``loop.py``, ``render.py``):

    prompt        the messages before the first assistant message, through the chat template with
                  the generation prompt (``tokenize_prompts``, what the RL dataset does)
    agent turn    each assistant message's text tokenised on its own, loss mask 1; if the text does
                  not end on one of ``stop_strings`` the end-of-turn token (eos) follows, mask 1: the
                  engine samples it to end such a turn. A turn that ends on a stop string stops
                  inside the engine, so eos is never sampled and never trained.
    observation   a message between two assistant turns (user or tool role), rendered by
                  :class:`ObservationRenderer` for its role: the template's close piece, the text, the
                  open piece of the next assistant turn; loss mask 0
    the end       messages after the last assistant turn carry nothing to learn and are left out

Not supported (a clear error): two non-assistant messages in a row after the first assistant turn
(merge them), an assistant turn that goes on after a stop string (the engine would have ended it
there), and roles other than system, user, assistant and tool. The end-of-turn token is the
tokenizer's eos, as in the agent loop (ChatML models such as SmolLM2 and Qwen end turns on it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.errors import InputError
from posttrain.agents.render import ObservationRenderer
from posttrain.models import tokenize_prompts

ROLES = ("system", "user", "assistant", "tool")


class TranscriptError(InputError):
    """A conversation that cannot be laid out for training; the message names what is wrong."""


@dataclass(frozen=True)
class Transcript:
    prompt_ids: list[int]
    response_ids: list[int]  # agent turns and observations after the prompt
    loss_mask: list[int]     # 1 on agent tokens, 0 on observations

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class TranscriptTokenizer:
    """Tokenises chat transcripts for ``tokenizer`` the way the agent loop does (module docstring)."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = (), tools: Sequence[Mapping[str, Any]] = (),
                 tool_format: str = "auto") -> None:
        """``tools``: the schemas a tool-calling agent's prompt tells it about in ``tool_format`` (as the RL prompts do)."""
        tokenize_prompts([[{"role": "user", "content": "x"}]], tokenizer)  # raises for a tokenizer without a chat template
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.tools = [dict(schema) for schema in tools] or None
        self.tool_format = tool_format
        self._renderers: dict[str, ObservationRenderer] = {}

    def renderer(self, role: str) -> ObservationRenderer:
        if role not in self._renderers:
            self._renderers[role] = ObservationRenderer(self.tokenizer, role)
        return self._renderers[role]

    def __call__(self, messages: Sequence[Mapping[str, str]], row_tools: Sequence[Mapping[str, Any]] = ()) -> Transcript:
        """``row_tools``: the row's own tool schemas, told in its prompt after the run's (as in RL prompts)."""
        check_messages(messages)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        if first == 0:
            raise TranscriptError("the conversation starts with an assistant message; it needs a prompt (a user message) before it")
        prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:first]]
        prompt_ids = list(tokenize_prompts([prompt], self.tokenizer, self.tools, [list(row_tools)], self.tool_format)[0])
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        response, mask = [], []
        for index in range(first, last + 1):
            message = messages[index]
            if message["role"] == "assistant":
                turn = self._agent_turn(message["content"])
                response += turn
                mask += [1] * len(turn)
                continue
            if messages[index - 1]["role"] != "assistant":
                raise TranscriptError(
                    f"messages {index - 1} and {index} are both {messages[index - 1]['role']!r}/{message['role']!r} after the "
                    "first assistant turn; the agent loop shows one observation between agent turns, so merge them"
                )
            rendered = self.renderer(message["role"]).render(
                message["content"], after_token=response[-1] if response else None, budget=10**9,
            )
            response += rendered.token_ids
            mask += [0] * len(rendered.token_ids)
        return Transcript(prompt_ids, response, mask)

    def _agent_turn(self, text: str) -> list[int]:
        return agent_turn_ids(self.tokenizer, text, self.stop_strings)


def agent_turn_ids(tokenizer: Any, text: str, stop_strings: Sequence[str] = ()) -> list[int]:
    """An assistant turn's text as the tokens the engine would have sampled for it: the text tokenised on its
    own, then eos unless it ends on one of ``stop_strings`` (module docstring). Also how a reference answer
    becomes a response (rollout/guidance.py)."""
    for stop in stop_strings:
        end = text.find(stop)
        if end != -1 and end + len(stop) != len(text):
            raise TranscriptError(
                f"the assistant turn {text[:80]!r}... goes on after the stop string {stop!r}; the engine ends the turn "
                "there, so end the message at it (or split the turn)"
            )
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not any(text.endswith(stop) for stop in stop_strings):
        ids.append(tokenizer.eos_token_id)
    return ids


def check_messages(messages: Any) -> None:
    """Raise :class:`TranscriptError` unless ``messages`` is a list of {role, content} with an assistant turn."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise TranscriptError(f"messages is {messages!r}, not a non-empty list of {{'role': ..., 'content': ...}}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise TranscriptError(f"message {i} is {message!r}: each message needs a 'role' and a str 'content'")
        if message.get("role") not in ROLES:
            raise TranscriptError(f"message {i} has role {message.get('role')!r}; the roles are {', '.join(ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise TranscriptError("the conversation has no assistant message, so there is nothing to learn; add the assistant's turns")
