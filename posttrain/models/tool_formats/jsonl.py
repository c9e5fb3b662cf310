"""Plain JSON lines (``env.tool_format: jsonl``), for any chat template, with no tags to learn:

- the system message lists the tools, one schema per line, after how to call them;
- the model calls a tool by writing a line that is a JSON object ``{"name": ..., "arguments": {...}}``
  and nothing else (one line per call; several calls in one turn are several lines); any other line
  is text, and a turn with no call line is the answer;
- a line that starts like a call (``{"name"``) but is not one (bad JSON, no name, arguments that are
  not an object) is a malformed call;
- results come back in the next user message, one line ``{"name": ..., "content": ...}`` per call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from posttrain.models.tool_formats.base import ToolFormat, refuse_parser
from posttrain.models.tool_formats.builtin import with_system_text
from posttrain.models.tool_formats.parsers import ParsedCall, ParsedTurn

INSTRUCTIONS = (
    "You can use the tools below. To call one, write a line with only a JSON object holding the tool's name and "
    'its arguments, like {{"name": "{example}", "arguments": {{...}}}}; for several calls, one line each. Each result '
    'comes back to you as a line {{"name": ..., "content": ...}}. When you need no tool, answer directly.\n'
    "Tools:\n{schemas}"
)
_CALL_START = re.compile(r'^\s*\{\s*"name"\s*:')


class JsonLinesFormat(ToolFormat):
    name: ClassVar[str] = "jsonl"
    observation_role: ClassVar[str] = "user"
    malformed_hint: ClassVar[str] = 'the call could not be read; write it on a line of its own as {"name": ..., "arguments": {...}} with valid JSON'

    def __init__(self, tokenizer: Any, schemas: Sequence[dict[str, Any]] = (), parser: str = "auto") -> None:
        refuse_parser(self.name, parser)
        super().__init__(tokenizer, schemas, parser)

    def render_tools(self, conversations: Sequence[Sequence[dict[str, str]]], schemas: Sequence[dict[str, Any]]) -> list[str]:
        lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
        instructions = INSTRUCTIONS.format(example=schemas[0]["function"]["name"], schemas=lines)
        return self.tokenizer.apply_chat_template([with_system_text(c, instructions) for c in conversations],
                                                  add_generation_prompt=True, tokenize=False)

    def parse(self, text: str, schemas: Sequence[dict[str, Any]] | None = None) -> ParsedTurn:
        calls, content, malformed = [], [], 0
        for line in text.splitlines():
            if not _CALL_START.match(line):
                content.append(line)
                continue
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                data = None
            arguments = data.get("arguments", {}) if isinstance(data, dict) else None
            if isinstance(data, dict) and isinstance(data.get("name"), str) and isinstance(arguments, dict):
                calls.append(ParsedCall(data["name"], json.dumps(arguments, ensure_ascii=False)))
            else:
                malformed += 1
        return ParsedTurn(calls, "\n".join(content).strip() if calls or malformed else text, malformed)

    def observation(self, results: Sequence[tuple[str, str]]) -> str:
        return "\n".join(json.dumps({"name": name, "content": text}, ensure_ascii=False) for name, text in results)
