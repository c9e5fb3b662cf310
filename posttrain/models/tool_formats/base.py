"""What a tool format is: how a model is told its tools, how it writes a call, how results come back.

A format is one class, in one file of this package, with a ``name``; defining it registers it
(``env.tool_format: <name>``; ``posttrain tools --formats`` lists them). It renders prompts
(:meth:`ToolFormat.render`), reads an agent turn's calls (:meth:`ToolFormat.parse`), writes the message
that carries a turn's results (:meth:`ToolFormat.observation`) in the chat role it names
(``observation_role``), and says how a call is written when one could not be read (``malformed_hint``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from posttrain.errors import InputError
from posttrain.models.tool_formats.parsers import CallParser, ParsedTurn, auto_parser_name

FORMATS: dict[str, type[ToolFormat]] = {}  # env.tool_format → class, filled as each format's class is defined


class ToolFormat:
    """A tool-call format; subclasses set ``name`` and implement the three methods."""

    name: ClassVar[str] = ""
    observation_role: ClassVar[str] = "user"  # the chat role of the message that carries results
    malformed_hint: ClassVar[str] = ""        # what the model is told when a call could not be read

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # its own name: a subclass that keeps its parent's is not registered
            known = FORMATS.get(cls.name)
            if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"two tool formats are named {cls.name!r}: {FORMATS[cls.name].__module__} and {cls.__module__}")
            FORMATS[cls.name] = cls

    def __init__(self, tokenizer: Any, schemas: Sequence[dict[str, Any]] = (), parser: str = "auto") -> None:
        """``tokenizer``: the model's (None where nothing is rendered); ``schemas``: the run's tools;
        ``parser``: ``env.tool_parser``, for the formats that read calls with vLLM's parsers."""
        self.tokenizer = tokenizer

    def render(self, conversations: Sequence[Sequence[dict[str, str]]], schemas: Sequence[dict[str, Any]] | None) -> list[str]:
        """Each conversation as prompt text, with the generation prompt, told about ``schemas``."""
        if not schemas:
            return self.tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False)
        return self.render_tools(conversations, schemas)

    def render_tools(self, conversations: Sequence[Sequence[dict[str, str]]], schemas: Sequence[dict[str, Any]]) -> list[str]:
        raise NotImplementedError

    def parse(self, text: str, schemas: Sequence[dict[str, Any]] | None = None) -> ParsedTurn:
        """The calls in an agent turn's ``text``; ``schemas``: the tools its prompt was told, where they are
        not the run's (a row's own tools)."""
        raise NotImplementedError

    def observation(self, results: Sequence[tuple[str, str]]) -> str:
        """The text of the message that carries a turn's results, ``(name, text)`` per call, in call order."""
        raise NotImplementedError


class ParsedByVLLM(ToolFormat):
    """A format whose calls are read by the vLLM tool parser ``env.tool_parser`` names (auto: the one the
    chat template implies; the hermes reader without vLLM)."""

    def __init__(self, tokenizer: Any, schemas: Sequence[dict[str, Any]] = (), parser: str = "auto") -> None:
        super().__init__(tokenizer, schemas, parser)
        self._parser_setting = parser
        self._schemas = list(schemas)
        self._parser: CallParser | None = None  # made at the first parse: rendering needs none

    @property
    def parser(self) -> CallParser:
        if self._parser is None:
            setting = self._parser_setting
            self._parser = CallParser(auto_parser_name(self.tokenizer) if setting == "auto" else setting, self.tokenizer, self._schemas)
        return self._parser

    def parse(self, text: str, schemas: Sequence[dict[str, Any]] | None = None) -> ParsedTurn:
        return self.parser(text, schemas)


def refuse_parser(format_name: str, parser: str) -> None:
    """For a format that reads its own calls: ``env.tool_parser`` must stay auto."""
    if parser != "auto":
        raise InputError(f"env.tool_format={format_name} reads its own calls; env.tool_parser={parser!r} is for the builtin "
                         "and template formats (leave it auto)")
