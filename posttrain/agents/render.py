"""Observations as chat turns, in tokens, cut to a budget.

After an agent turn the conversation continues with the environment's observation as a user (or
tool) message and a fresh assistant header, exactly as the tokenizer's chat template would render
it. The template is rendered once with marker strings to learn its three pieces:

    <assistant text>  ┆ close ┆ <observation> ┆ open
    "...</search>"    ┆ "<|im_end|>\\n<|im_start|>user\\n" ┆ "..." ┆ "<|im_end|>\\n<|im_start|>assistant\\n"

``close`` ends the agent's turn and opens the observation's message; ``open`` ends it and starts the
next assistant turn. Only these pieces and the observation are tokenised; the agent's own tokens are
never decoded and re-encoded. When an agent turn already ended on the template's end-of-turn token
(it sampled eos), that token is not added a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.errors import InputError

_AGENT_MARK = "\x00AGENT\x00"
TRUNCATION_NOTE = " ...(truncated)"


@dataclass(frozen=True)
class RenderedObservation:
    token_ids: list[int]
    truncated: bool
    text: str  # the observation as shown: cut, with the truncation note, when it did not fit


class ObservationRenderer:
    """Renders observations for ``tokenizer``'s chat template with role ``role`` (user or tool)."""

    def __init__(self, tokenizer: Any, role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.role = role
        close, open_ = template_pieces(tokenizer, [role], "set env.observation_role=user, or use a chat model whose template keeps every message")
        self.close_ids = self._encode(close)
        self.open_ids = self._encode(open_)
        self.note_ids = self._encode(TRUNCATION_NOTE)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render(self, observation: str, *, after_token: int | None, budget: int, suffix: str = "") -> RenderedObservation | None:
        """The tokens to append after an agent turn that ended on ``after_token``.

        At most ``budget`` tokens: a longer observation keeps its beginning and ends with a
        truncation note; ``suffix`` (on its own line, e.g. an instruction) is never cut. ``None``
        when the template pieces and the suffix alone do not fit.
        """
        close = self.close_ids
        if close and after_token is not None and after_token == close[0] == self.tokenizer.eos_token_id:
            close = close[1:]
        suffix_ids = self._encode("\n" + suffix if observation and suffix else suffix)
        room = budget - len(close) - len(self.open_ids) - len(suffix_ids)
        if room < 0:
            return None
        content = self._encode(observation)
        truncated = len(content) > room
        text = observation
        if truncated:
            keep = max(room - len(self.note_ids), 0)
            content = (content[:keep] + self.note_ids)[:room]
            text = self.tokenizer.decode(content)
        return RenderedObservation(close + content + suffix_ids + self.open_ids, truncated, text)


def render_turns(tokenizer: Any, messages: list[tuple[str, str | tuple[str, ...]]], *, after_token: int | None) -> list[int]:
    """The tokens that follow an agent turn ending on ``after_token`` when the conversation goes on with
    ``messages`` (``(role, text)`` each) and then a fresh assistant header, as the chat template renders
    them. As for one observation (:class:`ObservationRenderer`), the template's pieces between the
    messages and each message's text are tokenised apart, and the end-of-turn token the agent sampled is
    not added again; for one message it gives what ``ObservationRenderer(tokenizer, role).render`` does.
    A text given as pieces is tokenised piece by piece (``(observation, "\n" + suffix)`` is ``render``'s
    observation with its suffix)."""
    pieces = template_pieces(tokenizer, [role for role, _ in messages], "multi-turn programs need a template that keeps every message")

    def encode(piece: str) -> list[int]:
        return list(tokenizer.encode(piece, add_special_tokens=False))

    ids = encode(pieces[0])
    if ids and after_token is not None and after_token == ids[0] == tokenizer.eos_token_id:
        ids = ids[1:]
    for (_, content), piece in zip(messages, pieces[1:]):
        for part in (content,) if isinstance(content, str) else content:
            ids += encode(part)
        ids += encode(piece)
    return ids


def template_pieces(tokenizer: Any, roles: list[str], hint: str) -> list[str]:
    """The chat template's text around messages of ``roles`` that follow an assistant turn: the piece that
    closes the turn and opens the first message, one between each two, and the one that closes the last
    and opens the next assistant turn (``len(roles) + 1`` pieces), learnt by rendering marker strings.
    An :class:`InputError` ending with ``hint`` where the template cannot render them or drops one."""
    marks = [f"\x00MESSAGE{index}\x00" for index in range(len(roles))]
    conversation = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _AGENT_MARK}]
    conversation += [{"role": role, "content": mark} for role, mark in zip(roles, marks)]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # templates raise their own errors for roles or orders they do not know
        raise InputError(f"the tokenizer's chat template cannot render messages of roles {roles} after an assistant turn "
                         f"({error}); {hint}") from error
    tail = text.split(_AGENT_MARK, 1)[1] if _AGENT_MARK in text else None
    pieces = []
    for mark in marks:
        if tail is None or mark not in tail:
            raise InputError(f"the tokenizer's chat template dropped the assistant message or one of roles {roles} when "
                             f"rendering a conversation; {hint}")
        head, tail = tail.split(mark, 1)
        pieces.append(head)
    return pieces + [tail]
