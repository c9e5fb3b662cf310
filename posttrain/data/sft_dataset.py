"""Supervised fine-tuning data: chat transcripts in, token rows with a loss mask out.

Files are Parquet (``.parquet``) or JSON lines (``.jsonl``, e.g. ``posttrain eval --dump-episodes``),
read in the order given. A row is one of

=====================  ==========================================================================
columns                meaning
=====================  ==========================================================================
``messages``           a list of chat messages ``{role, content}`` (verl's multi-turn SFT layout);
                       the column name is ``messages_key``. ``extra_info`` may be present and is kept;
                       the row's own tools (a ``tools`` column or ``extra_info.tools``: OpenAI tool
                       schemas, a list or its JSON text) are told in its prompt beside the run's,
                       as in RL prompts (posttrain/data/format.py)
``prompt``/``response``  a single-turn pair: ``prompt`` a str (one user message) or a list of chat
                       messages (verl's RL row), ``response`` the assistant's str
=====================  ==========================================================================

Each row is tokenised by :class:`~posttrain.agents.transcript.TranscriptTokenizer`: the loss falls on
assistant tokens only, laid out exactly as the agent loop lays out an episode. A transcript longer
than ``max_length`` tokens is handled by ``truncation``:

- ``"error"``: refused, naming the file and row;
- ``"drop"`` (default): left out and counted (:attr:`SFTDataset.num_dropped`);
- ``"left"``: the prompt loses tokens from its left (its start) until the row fits; a row whose
  response alone is over ``max_length`` is dropped and counted.

Rows with ``require_success`` set keep only those whose ``success`` column is true (a dump of the
policy's own episodes: rejection-sampling fine-tuning). Every malformed row raises
:class:`SFTDataError` naming file, row and field before any training starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.agents.transcript import Transcript, TranscriptError, TranscriptTokenizer
from posttrain.data.format import DataFormatError
from posttrain.errors import InputError
from posttrain.models.tool_format import ROW_TOOLS_KEY, row_schemas

logger = logging.getLogger(__name__)

SFT_TRUNCATION_MODES = ("error", "drop", "left")
FORMAT_HINT = (
    "An SFT row needs a '{key}' column of chat messages [{{'role': 'user', 'content': ...}}, {{'role': 'assistant', "
    "'content': ...}}, ...], or 'prompt' and 'response' columns (str, or chat messages for the prompt)"
)


class SFTDataError(DataFormatError):
    """An SFT file or row that cannot be used; the message names file, row and field."""


@dataclass(frozen=True)
class SFTSample:
    transcript: Transcript
    extra_info: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    row: int = 0


class SFTDataset:
    """Tokenised transcripts from ``files`` (see the module docstring); indexing gives :class:`SFTSample`."""

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer: Any,
        *,
        max_length: int,
        messages_key: str = "messages",
        truncation: str = "drop",
        stop_strings: Sequence[str] = (),
        require_success: bool = False,
        tools: Sequence[dict[str, Any]] = (),
        tool_format: str = "auto",
    ) -> None:
        if truncation not in SFT_TRUNCATION_MODES:
            raise InputError(f"sft.truncation={truncation!r}: use one of {', '.join(SFT_TRUNCATION_MODES)}")
        if max_length < 2:
            raise InputError(f"sft.max_length={max_length}: must be at least 2 tokens")
        if not files:
            raise SFTDataError("no SFT files given; set sft.train_files=[file.parquet,...] (a 'messages' column of chat turns)")
        layout = TranscriptTokenizer(tokenizer, stop_strings, tools, tool_format)
        self.samples: list[SFTSample] = []
        self.num_dropped = 0
        self.num_rows = 0
        for file in files:
            for row, record in enumerate(read_records(Path(file))):
                self.num_rows += 1
                if require_success and not record.get("success", False):
                    continue
                messages = row_messages(record, messages_key, file, row)
                try:
                    transcript = layout(messages, record_tools(record, file, row))
                except TranscriptError as error:
                    raise SFTDataError(f"{file} row {row}, field {messages_key!r}: {error}") from error
                fitted = _fit(transcript, max_length, truncation, file, row)
                if fitted is None:
                    self.num_dropped += 1
                    continue
                self.samples.append(SFTSample(fitted, dict(record.get("extra_info") or {}), str(file), row))
        if self.num_dropped:
            logger.warning("dropped %d of %d SFT rows longer than sft.max_length=%d tokens", self.num_dropped, self.num_rows, max_length)
        if not self.samples:
            raise SFTDataError(
                f"no SFT rows left out of {self.num_rows} in {[str(f) for f in files]}"
                + (f": {self.num_dropped} are longer than sft.max_length={max_length}; raise it" if self.num_dropped else "")
                + (" (sft.require_success keeps only rows whose 'success' is true)" if require_success else "")
            )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> SFTSample:
        return self.samples[index]


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of a Parquet or JSON-lines file as dicts."""
    if not path.is_file():
        raise SFTDataError(f"SFT file {path} does not exist; set sft.train_files / sft.val_files to Parquet or JSON-lines files")
    if path.suffix == ".jsonl":
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SFTDataError(f"{path} line {number + 1} is not JSON ({error})") from error
            if not isinstance(record, dict):
                raise SFTDataError(f"{path} line {number + 1} is {type(record).__name__}, not a JSON object with a 'messages' field")
            records.append(record)
        return records
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for "not Parquet"
        raise SFTDataError(f"cannot read {path} as Parquet ({error}); SFT files are .parquet or .jsonl") from error


def record_tools(record: dict[str, Any], file: str | Path, row: int) -> list[dict[str, Any]]:
    """The row's own tool schemas: its ``tools`` column or ``extra_info.tools``."""
    extra = record.get("extra_info") or {}
    value = record.get(ROW_TOOLS_KEY)
    if value is None and isinstance(extra, dict):
        value = extra.get(ROW_TOOLS_KEY)
    try:
        return row_schemas(value)
    except InputError as error:
        raise SFTDataError(f"{file} row {row}, field 'tools': {error}") from None


def row_messages(record: dict[str, Any], messages_key: str, file: str | Path, row: int) -> list[dict[str, str]]:
    """The row's conversation: its ``messages_key`` column, or prompt + response."""
    if messages_key in record and record[messages_key] is not None:
        messages = record[messages_key]
        if not isinstance(messages, list):
            raise SFTDataError(f"{file} row {row}, field {messages_key!r}: {messages!r} is not a list of chat messages. " + FORMAT_HINT.format(key=messages_key))
        return messages
    if "prompt" in record and "response" in record:
        prompt, response = record["prompt"], record["response"]
        if not isinstance(response, str):
            raise SFTDataError(f"{file} row {row}, field 'response': {response!r} is not a str")
        prompt_messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(prompt_messages, list):
            raise SFTDataError(f"{file} row {row}, field 'prompt': {prompt!r} is neither a str nor a list of chat messages")
        return [*prompt_messages, {"role": "assistant", "content": response}]
    raise SFTDataError(f"{file} row {row} has columns {sorted(record)}. " + FORMAT_HINT.format(key=messages_key))


def _fit(transcript: Transcript, max_length: int, truncation: str, file: str | Path, row: int) -> Transcript | None:
    if transcript.length <= max_length:
        return transcript
    if truncation == "error":
        raise SFTDataError(
            f"{file} row {row} is {transcript.length} tokens ({len(transcript.prompt_ids)} prompt + "
            f"{len(transcript.response_ids)} response), over sft.max_length={max_length}; raise sft.max_length, or set "
            "sft.truncation=drop (leave such rows out) or left (cut the prompt's start)"
        )
    keep = max_length - len(transcript.response_ids)
    if truncation == "drop" or keep < 1:
        return None
    return Transcript(transcript.prompt_ids[-keep:], transcript.response_ids, transcript.loss_mask)
