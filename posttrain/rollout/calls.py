"""A one-turn task whose answer is its calls (``env.name: tools`` with ``env.options.answer: calls``,
e.g. BFCL's single-turn categories) runs as a single-turn rollout, not through the agent loop.

Each response is read by the run's tool format (``env.tool_format``; the row's own tools and the
run's), each call checked as a call that would run is (an unknown tool, arguments that are not JSON or
do not fit the schema, too large), and the calls, in the order written, go to the reward path as the
answer (``calls=[{"name": ..., "arguments": {...}}, ...]``, [] for a response with no call: an
irrelevance row's right answer) with the row's ``extra_info``; no call runs. A response with a call
that could not be read (``bad_json``, ``too_large``) scores 0 without asking the score function.

Counters, per response as an agent episode's are (``tool/calls``, ``tool/successes``, ``tool/errors``,
``tool/errors/<kind>``, ``answers``: each summed over the step's responses, a count), and each
response's in the validation's episode records.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain import keys
from posttrain.agents.env import EpisodeSample
from posttrain.agents.metrics import counter_metrics
from posttrain.config.schema import EnvConfig
from posttrain.metrics import Metrics
from posttrain.models.tool_format import ROW_TOOLS_KEY, row_schemas
from posttrain.protocol import Batch
from posttrain.rewards.manager import Answer
from posttrain.rollout.toolbox import open_toolbox, sample_checker, uses_tools
from posttrain.tools import CallResult, ToolBox
from posttrain.tools.env import ToolEnv, answer_mode

UNREADABLE = ("bad_json", "too_large")  # a call no score function could judge
COUNTERS = ("answers", "tool/calls", "tool/successes", "tool/errors")


def answers_with_calls(env: EnvConfig) -> bool:
    """The run's answers are its calls: a tool environment with ``env.options.answer: calls``."""
    return uses_tools(env) and answer_mode(env.options).calls_are_the_answer


class CallsAnswers:
    """The run's toolbox (its format and checks; nothing runs), opened with the rollout; each row
    checked before any worker starts; each response read into its answer."""

    def __init__(self, env: EnvConfig, tokenizer: Any) -> None:
        self.env, self.tokenizer = env, tokenizer
        self.toolbox: ToolBox | None = None
        self._check: Callable[[EpisodeSample], None] | None = None

    def check(self, sample: EpisodeSample) -> None:
        """Raise InputError for a row the calls cannot answer (its tools unreadable, no tools, no score function)."""
        if self._check is None:  # the data sources are SingleTurnRollout.check_data's
            self._check = sample_checker(self.env, by_data_source=False)
        self._check(sample)

    def open(self) -> None:
        self.toolbox = open_toolbox(self.env, self.tokenizer)

    def close(self) -> None:
        if self.toolbox is not None:
            self.toolbox.close()
            self.toolbox = None

    def __call__(self, texts: Sequence[str], batch: Batch) -> tuple[list[Answer | None], list[dict[str, float]]]:
        """Each response's answer (None: a call could not be read) and its counters."""
        answers, counts = [], []
        for text, truth, source, extra in zip(texts, batch[keys.GROUND_TRUTH], batch[keys.DATA_SOURCE], batch[keys.EXTRA_INFO],
                                              strict=True):
            answer, count = self.read(text, EpisodeSample([], truth, str(source), dict(extra or {})))
            answers.append(answer)
            counts.append(count)
        return answers, counts

    def read(self, text: str, sample: EpisodeSample) -> tuple[Answer | None, dict[str, float]]:
        if self.toolbox is None:
            raise RuntimeError("CallsAnswers.open() must be called before responses are read (it opens the toolbox)")
        row_schemas_ = row_schemas(sample.extra_info.get(ROW_TOOLS_KEY))
        row_tools = {schema["function"]["name"]: schema["function"] for schema in row_schemas_}
        turn = self.toolbox.read(text, row_schemas_)
        checked = [self.toolbox.check(call, row_tools) for call in turn.calls]
        errors = [c.error for c in checked if isinstance(c, CallResult)] + ["bad_json"] * turn.malformed
        counts: dict[str, float] = defaultdict(float, {"answers": 1, "tool/calls": len(turn.calls) + turn.malformed})
        counts["tool/successes"] = counts["tool/calls"] - len(errors)
        for kind in errors:
            counts["tool/errors"] += 1
            counts[f"tool/errors/{kind}"] += 1
        arguments = [c if isinstance(c, dict) else _json_object(call.arguments) for call, c in zip(turn.calls, checked)]
        if any(kind in UNREADABLE for kind in errors) or None in arguments:
            return None, dict(counts)
        calls = [{"name": call.name, "arguments": args} for call, args in zip(turn.calls, arguments)]
        return Answer(text, sample.ground_truth, sample.data_source, sample.extra_info, calls, sample.prompt), dict(counts)


def calls_metrics(counts: Sequence[Mapping[str, float]]) -> Metrics:
    """The responses' counters as an agent episode's are reported (agents/metrics.py), with ``tool/success_rate``."""
    return counter_metrics(counts, COUNTERS, ToolEnv.ratios)


def _json_object(text: str) -> dict[str, Any] | None:
    """A call's arguments as a dict, or None where they are not a JSON object."""
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
