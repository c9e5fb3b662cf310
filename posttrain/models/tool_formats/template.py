"""The model's own format (``env.tool_format: template``): a chat template that renders ``tools=``
(Qwen, Llama 3.1+, Mistral, Hermes...) is given the schemas and writes them its own way; calls are read
by the vLLM parser its template implies (or ``env.tool_parser``); results go back as tool messages,
which the template wraps. Whether a template renders tools is found by rendering one with a made-up
tool and looking for its name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from posttrain.models.tool_formats.base import ParsedByVLLM

_PROBE = {"type": "function", "function": {"name": "posttrain_probe_tool_x7", "description": "probe",
                                            "parameters": {"type": "object", "properties": {}}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes the schemas given as ``tools=``."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[_PROBE], tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return _PROBE["function"]["name"] in text


class TemplateFormat(ParsedByVLLM):
    name: ClassVar[str] = "template"
    observation_role: ClassVar[str] = "tool"
    malformed_hint: ClassVar[str] = "the call could not be read; write it as your tool-call format says, with valid JSON arguments"

    def render_tools(self, conversations: Sequence[Sequence[dict[str, str]]], schemas: Sequence[dict[str, Any]]) -> list[str]:
        return [self.tokenizer.apply_chat_template(list(c), tools=list(schemas), add_generation_prompt=True, tokenize=False)
                for c in conversations]

    def observation(self, results: Sequence[tuple[str, str]]) -> str:
        return "\n\n".join(text for _, text in results)
