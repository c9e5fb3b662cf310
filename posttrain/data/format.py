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
``tools``          the row's own tools: OpenAI tool schemas,   no
                   a list or its JSON text (or ``extra_info.tools``)
=================  ==========================================  =========

A row's own ``tools`` (for tool-calling agents, ``env.name: tools``) are told to the model in that
row's prompt beside the run's ``env.tools`` (models/tool_format.py) and are what its calls are checked
against. Rows' schemas differ, so JSON text is the practical Parquet type; whichever way they come,
they travel on as ``extra_info["tools"]`` in JSON text (episode files, the async buffer).

Files are read one at a time and their rows concatenated, so files whose optional columns or
``extra_info`` fields differ can still be mixed. Users' own Parquet in this format needs no code.

Every row is checked when it is read, and all the problems of all the files are reported together
(:func:`problems_report`: each names the file, the row and the field, and each kind of problem says
its fix once): a prompt that is not a list of chat messages, a message whose role is not one of
:data:`CHAT_ROLES`, a ``reward_model`` without a ``ground_truth`` field. Whether a row can be
*scored* (its ``data_source`` has a score function, its ground truth is there to compare with)
depends on the run's reward; the rollout checks that after loading, with the same report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import InputError
from posttrain.models.tool_format import ROW_TOOLS_KEY, row_schemas

REQUIRED_COLUMNS = ("data_source", "reward_model")
# the roles chat templates know; any other is rendered wrongly or not at all
CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_LISTED_PROBLEMS = 10
# extra_info field a preparer sets true on a training row whose question an SFT warm-up learnt from
# (data.dev_size never holds such a row back: posttrain/data/dataset.py split_dev)
IN_SFT = "in_sft"
# extra_info field a preparer sets true on a training row kept for RL alone, beyond the cap the SFT warm-up's data
# had (posttrain prepare bfcl rl_prompt_tokens): never held back either, so the development rows stay the capped data's
RL_ONLY = "rl_only"
# extra_info field: the text of a right answer to the row, which algorithm.guidance gives a group of answers with
# none right (posttrain/rollout/guidance.py); a preparer writes it where it has one
REFERENCE_ANSWER = "reference_answer"
FORMAT_HINT = (
    "Each row needs data_source (str), {prompt_key} (a list of chat messages like "
    "[{{'role': 'user', 'content': '...'}}]), reward_model (a struct with ground_truth, e.g. "
    "{{'style': 'rule', 'ground_truth': '42'}}) and optionally ability (str) and extra_info (a struct "
    "such as {{'split': 'train', 'index': 0}}). `posttrain prepare gsm8k --out DIR` writes an example."
)


class DataFormatError(InputError):
    """A data file is missing, unreadable or not in verl's row format; the message says how to fix it."""


@dataclass(frozen=True)
class RowProblem:
    """One thing wrong with one field of one row."""

    file: Path
    row: int      # position within ``file``
    field: str    # e.g. ``prompt[1].role``, ``data_source``, ``reward_model.ground_truth``
    problem: str  # what is wrong with its value
    fix: str      # what to do; said once per report, however many rows share it


def problems_report(problems: Sequence[RowProblem]) -> str:
    """One message for ``problems``: the first :data:`MAX_LISTED_PROBLEMS` one a line, how many
    more there are, then each distinct fix. A row read twice (one file for training and validation) counts once."""
    problems = list(dict.fromkeys(problems))
    lines = [f"{len(problems)} problem(s) in the data:"]
    lines += [f"  {p.file} row {p.row}, {p.field}: {p.problem}" for p in problems[:MAX_LISTED_PROBLEMS]]
    if len(problems) > MAX_LISTED_PROBLEMS:
        lines.append(f"  ... and {len(problems) - MAX_LISTED_PROBLEMS} more")
    lines += [f"Fix: {fix}" for fix in dict.fromkeys(p.fix for p in problems)]
    return "\n".join(lines)


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

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The row's own tool schemas (module docstring); [] for none."""
        return row_schemas(self.extra_info.get(ROW_TOOLS_KEY))


def read_rows(files: Sequence[str | Path], prompt_key: str = "prompt") -> list[PromptRow]:
    """Rows of all ``files`` in order (the files concatenated).

    Raises :class:`DataFormatError` naming the file and the column when a file is missing, is not
    Parquet or lacks a required column; and, after reading every file, one listing each row problem
    (module docstring) by file, row and field.
    """
    if isinstance(files, (str, Path)):
        files = [files]
    if not files:
        raise DataFormatError("no data files given; pass Parquet files (data.train_files / data.val_files)")
    rows: list[PromptRow] = []
    problems: list[RowProblem] = []
    for file in files:
        for row in _read_file(Path(file), prompt_key):
            found = list(_row_problems(row, prompt_key))
            if found:
                problems += found
            else:
                rows.append(_make_row(row, prompt_key))
    if problems:
        raise DataFormatError(problems_report(problems))
    return rows


@dataclass(frozen=True)
class _RawRow:
    values: dict[str, Any]  # column name -> this row's value
    file: Path
    row: int


def _read_file(path: Path, prompt_key: str) -> list[_RawRow]:
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
    return [_RawRow({name: values[i] for name, values in columns.items()}, path, i) for i in range(table.num_rows)]


def _row_problems(raw: _RawRow, prompt_key: str) -> Iterator[RowProblem]:
    messages, reward_model = raw.values[prompt_key], raw.values["reward_model"]
    if not _is_chat(messages):
        yield RowProblem(raw.file, raw.row, prompt_key, f"{messages!r:.100} is not a list of chat messages",
                         FORMAT_HINT.format(prompt_key=prompt_key))
    else:
        for index, message in enumerate(messages):
            if message["role"] not in CHAT_ROLES:
                yield RowProblem(
                    raw.file, raw.row, f"{prompt_key}[{index}].role", f"{message['role']!r} is not a chat role",
                    f"give each message one of the roles {', '.join(CHAT_ROLES)} (the model's own turns are "
                    "'assistant', a tool's or environment's output 'tool')",
                )
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        yield RowProblem(raw.file, raw.row, "reward_model", f"{reward_model!r:.100} is not a struct with a ground_truth field",
                         FORMAT_HINT.format(prompt_key=prompt_key))
    yield from _tools_problems(raw)


TOOLS_FIX = ("give a row's tools as a list of OpenAI tool schemas [{'type': 'function', 'function': {'name': ..., "
             "'description': ..., 'parameters': {JSON Schema}}}], or its JSON text, in a tools column or extra_info.tools")


def _tools_problems(raw: _RawRow) -> Iterator[RowProblem]:
    column, extra = raw.values.get(ROW_TOOLS_KEY), raw.values["extra_info"] or {}
    if column is not None and isinstance(extra, dict) and extra.get(ROW_TOOLS_KEY) is not None:
        yield RowProblem(raw.file, raw.row, ROW_TOOLS_KEY, "the row has both a tools column and extra_info.tools", TOOLS_FIX)
        return
    field_name = ROW_TOOLS_KEY if column is not None else f"extra_info.{ROW_TOOLS_KEY}"
    try:
        row_schemas(column if column is not None else extra.get(ROW_TOOLS_KEY) if isinstance(extra, dict) else None)
    except InputError as error:
        yield RowProblem(raw.file, raw.row, field_name, str(error), TOOLS_FIX)


def _make_row(raw: _RawRow, prompt_key: str) -> PromptRow:
    values = raw.values
    extra_info = dict(values["extra_info"] or {})
    given = values.get(ROW_TOOLS_KEY) if values.get(ROW_TOOLS_KEY) is not None else extra_info.get(ROW_TOOLS_KEY)
    tools = row_schemas(given)
    # one carrier, one type, whichever way the row gave them; an empty list stays: the row is offered none
    if tools or given not in (None, ""):
        extra_info[ROW_TOOLS_KEY] = json.dumps(tools, ensure_ascii=False)
    else:
        extra_info.pop(ROW_TOOLS_KEY, None)
    return PromptRow(
        messages=[{"role": m["role"], "content": m["content"]} for m in values[prompt_key]],
        data_source=values["data_source"],
        ground_truth=values["reward_model"]["ground_truth"],
        ability=values["ability"],
        extra_info=extra_info,
        file=raw.file,
        row=raw.row,
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
