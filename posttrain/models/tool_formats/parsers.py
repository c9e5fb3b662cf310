"""Reading tool calls out of an agent turn (the builtin and template formats), with vLLM's own tool-call parsers.

``env.tool_parser`` names a parser of ``vllm.tool_parsers`` (``hermes``, ``llama3_json``,
``pythonic``, ``mistral``, ...; ``posttrain tools --parsers`` lists them). ``auto`` picks from the
model's chat template: a template that writes ``<tool_call>`` (Qwen, Hermes) or that has no tool
support at all (then posttrain's built-in format, which is Hermes-style, is used) → ``hermes``; a
Llama 3 template (``<|python_tag|>``/``ipython``) → ``llama3_json``. Any other template needs
``env.tool_parser`` set.

vLLM's parsers report a call they cannot read by returning no calls. So that a malformed call is an
error the model is told about (and not mistaken for a final answer), a turn is a **malformed call**
when it holds the parser's call marker (``<tool_call>`` for hermes) more often than the parser
returned calls. Where vLLM is not installed (the GPU image runs HF ``generate``), the ``hermes``
format is read by a short fallback with the same marker rule; it differs from vLLM's parser in that it
reads each call on its own (a valid call beside a broken one still runs) and takes a call without
``"arguments"`` as one with none. Other formats need vLLM.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.errors import InputError

MAX_ROW_REQUESTS = 4096  # requests kept for rows' own tool sets (a dataset of many rows, each its own)
# the text that starts a call in each format, to tell a malformed call from plain text
CALL_MARKERS = {"hermes": "<tool_call>", "qwen3_xml": "<tool_call>", "qwen3_json": "<tool_call>", "llama3_json": '{"name"',
                "mistral": "[TOOL_CALLS]"}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as the model wrote it (re-serialised by the parser)


@dataclass(frozen=True)
class ParsedTurn:
    calls: list[ParsedCall]
    content: str            # the text outside the calls
    malformed: int = 0      # calls that were started but could not be read

    @property
    def is_final(self) -> bool:
        """A turn with no call, not even a malformed one: the agent's answer."""
        return not self.calls and not self.malformed


def auto_parser_name(tokenizer: Any) -> str:
    """The parser ``env.tool_parser: auto`` means for ``tokenizer``'s chat template (module docstring)."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if "<tool_call>" in template or "tools" not in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    raise InputError(
        "cannot tell which tool-call format this model's chat template uses; set env.tool_parser to one of vLLM's "
        "parsers (`posttrain tools --parsers` lists them; hermes, llama3_json and pythonic are common)"
    )


def parser_names() -> list[str]:
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        return ["hermes"]
    return sorted(ToolParserManager.list_registered())


class CallParser:
    """Reads the calls of a turn's text in format ``name`` (a vLLM tool parser's name)."""

    def __init__(self, name: str, tokenizer: Any, schemas: Sequence[dict[str, Any]]) -> None:
        self.name = name
        self.marker = CALL_MARKERS.get(name)
        # without a tokenizer (a toolbox built by hand) the hermes format is read by the fallback
        self._vllm, self._request = (None, None) if tokenizer is None and name == "hermes" else _vllm_parser(name, tokenizer, schemas)
        self._row_requests: dict[str, Any] = {}  # a row's tools (JSON text) -> the request that names them

    def __call__(self, text: str, schemas: Sequence[dict[str, Any]] | None = None) -> ParsedTurn:
        """The calls in ``text``; ``schemas``: the tools this turn's prompt was told, where they are not the
        run's (a row's own tools: some parsers read the schemas, e.g. to type the arguments)."""
        if self._vllm is None:
            return _hermes(text)
        try:
            found = self._vllm.extract_tool_calls(text, self._request if schemas is None else self._request_for(schemas))
        except Exception:  # a parser that raises on odd text has read no call
            found = None
        calls = [ParsedCall(call.function.name, call.function.arguments or "{}") for call in (found.tool_calls if found and found.tools_called else [])]
        content = (found.content if found else None) or ("" if calls else text)
        started = text.count(self.marker) if self.marker else len(calls)
        return ParsedTurn(calls, content, malformed=max(started - len(calls), 0) if calls or started else 0)

    def _request_for(self, schemas: Sequence[dict[str, Any]]) -> Any:
        key = json.dumps(list(schemas), sort_keys=True)
        if key not in self._row_requests:
            if len(self._row_requests) >= MAX_ROW_REQUESTS:
                self._row_requests.clear()
            self._row_requests[key] = _request(schemas)
        return self._row_requests[key]


def _vllm_parser(name: str, tokenizer: Any, schemas: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        if name != "hermes":
            raise InputError(f"env.tool_parser={name!r} needs vLLM's tool parsers, and vLLM is not installed; use hermes") from None
        return None, None
    try:
        parser_class = ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise InputError(f"env.tool_parser={name!r} is not one of vLLM's tool parsers ({', '.join(parser_names())})") from None
    # vLLM logs a traceback for every call it cannot read; here those are counted (tool/errors/bad_json) instead
    logging.getLogger(parser_class.__module__).setLevel(logging.CRITICAL)
    return parser_class(tokenizer), _request(schemas)


def _request(schemas: Sequence[dict[str, Any]]) -> Any:
    """The chat request a vLLM parser reads the tools from."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[{"role": "user", "content": ""}], model="posttrain", tools=list(schemas) or None)


_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def _hermes(text: str) -> ParsedTurn:
    """The hermes format without vLLM: each ``<tool_call>{"name", "arguments"}</tool_call>``."""
    calls, malformed = [], 0
    for closed, open_ in _HERMES_CALL.findall(text):
        try:
            data = json.loads(closed or open_)
            calls.append(ParsedCall(str(data["name"]), json.dumps(data.get("arguments", {}), ensure_ascii=False)))
        except (ValueError, KeyError, TypeError, RecursionError):
            malformed += 1
    start = text.find("<tool_call>")
    return ParsedTurn(calls, text if start == -1 else text[:start], malformed)
