"""verl's row format for RL prompts, read from and written to Parquet with pyarrow.

One row is one prompt:

=================  ==========================================  =========
column             type                                        required
=================  ==========================================  =========
``data_source``    str — picks the reward function             yes
``prompt``         list of chat messages ``{role, content}``   yes (the name is ``prompt_key``)
``reward_model``   struct ``{style, ground_truth}``            yes
``ability``        str, e.g. ``"math"``                        no
``extra_info``     struct, e.g. ``{split, index, ...}``        no (``{}``)
=================  ==========================================  =========

Files are read one at a time and their rows concatenated, so files whose optional columns or
``extra_info`` fields differ can still be mixed. Users' own Parquet in this format needs no code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED_COLUMNS = ("data_source", "reward_model")
FORMAT_HINT = (
    "Each row needs data_source (str), {prompt_key} (a list of chat messages like "
    "[{{'role': 'user', 'content': '...'}}]), reward_model (a struct with ground_truth, e.g. "
    "{{'style': 'rule', 'ground_truth': '42'}}) and optionally ability (str) and extra_info (a struct "
    "such as {{'split': 'train', 'index': 0}}). `posttrain prepare gsm8k --out DIR` writes an example."
)


class DataFormatError(ValueError):
    """A data file is missing, unreadable or not in verl's row format; the message says how to fix it."""


@dataclass(frozen=True)
class PromptRow:
    """One prompt as read from a file, before templating and tokenising."""

    messages: list[dict[str, str]]
    data_source: str
    ground_truth: Any
    ability: str | None
    extra_info: dict[str, Any]
    file: Path
    row: int  # position within ``file``


def read_rows(files: Sequence[str | Path], prompt_key: str = "prompt") -> list[PromptRow]:
    """Rows of all ``files`` in order (the files concatenated).

    Raises :class:`DataFormatError` naming the file, and the column or row, when a file is missing,
    is not Parquet, lacks a required column, or holds a prompt that is not a list of chat messages.
    """
    if isinstance(files, (str, Path)):
        files = [files]
    if not files:
        raise DataFormatError("no data files given; pass Parquet files (data.train_files / data.val_files)")
    rows: list[PromptRow] = []
    for file in files:
        rows.extend(_read_file(Path(file), prompt_key))
    return rows


def _read_file(path: Path, prompt_key: str) -> list[PromptRow]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataFormatError(
            f"data file {path} does not exist; write one with `posttrain prepare NAME --out DIR` "
            "or point data.train_files / data.val_files at your own Parquet files"
        )
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several types for "not Parquet"
        raise DataFormatError(f"cannot read {path} as Parquet ({error}). {FORMAT_HINT.format(prompt_key=prompt_key)}") from error
    missing = [c for c in (prompt_key, *REQUIRED_COLUMNS) if c not in table.column_names]
    if missing:
        raise DataFormatError(
            f"{path} lacks column(s) {missing} (it has {table.column_names}). "
            + FORMAT_HINT.format(prompt_key=prompt_key)
        )
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for optional in ("ability", "extra_info"):
        columns.setdefault(optional, [None] * table.num_rows)
    return [_make_row(columns, i, path, prompt_key) for i in range(table.num_rows)]


def _make_row(columns: dict[str, list], i: int, path: Path, prompt_key: str) -> PromptRow:
    messages = columns[prompt_key][i]
    if not _is_chat(messages):
        raise DataFormatError(
            f"{path} row {i}: column {prompt_key!r} holds {messages!r}, not a list of chat messages. "
            + FORMAT_HINT.format(prompt_key=prompt_key)
        )
    reward_model = columns["reward_model"][i]
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataFormatError(
            f"{path} row {i}: reward_model is {reward_model!r}, not a struct with a ground_truth field. "
            + FORMAT_HINT.format(prompt_key=prompt_key)
        )
    return PromptRow(
        messages=[{"role": m["role"], "content": m["content"]} for m in messages],
        data_source=columns["data_source"][i],
        ground_truth=reward_model["ground_truth"],
        ability=columns["ability"][i],
        extra_info=dict(columns["extra_info"][i] or {}),
        file=path,
        row=i,
    )


def _is_chat(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and len(messages) > 0
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    )


def make_row(
    data_source: str,
    messages: list[dict[str, str]],
    ground_truth: Any,
    ability: str,
    extra_info: dict[str, Any],
    style: str = "rule",
) -> dict[str, Any]:
    """A row in verl's format, as a dict ready for :func:`write_rows`."""
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": style, "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write ``rows`` (from :func:`make_row`) to a Parquet file at ``path``; returns ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_conversations(conversations: list[list[dict[str, str]]], path: Path) -> Path:
    """Chat transcripts as a Parquet file with one ``messages`` column (what ``posttrain sft`` reads); returns ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"messages": m} for m in conversations]), path)
    return path
