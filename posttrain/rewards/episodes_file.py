"""Episodes files (``posttrain eval --dump-episodes``, a run's ``validation/step_N.jsonl``) read back: every
row with its line number (what ``posttrain compare`` and the recipes' tables read) and the rows of one data
source (what the reports of mistakes by kind read)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from posttrain.errors import InputError, read_utf8


def numbered_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """Each row of an episodes file with its line number (blank lines skipped); an InputError naming the line
    of one that is not a JSON object, or naming the file if it is not UTF-8 text."""
    for number, line in enumerate(read_utf8(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise InputError(f"{path} line {number} is not JSON ({error}); give an episodes file (`posttrain eval "
                             "--dump-episodes FILE.jsonl`, or a run's validation/step_N.jsonl)") from None
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number} is not an episode row (a JSON object)")
        yield number, row


def source_rows(path: Path, data_source: str, needs: Sequence[str], name: str) -> list[dict]:
    """The rows of ``data_source`` (a mixture's other sources left out; a row without one counts as it), each
    checked to hold the keys ``needs`` names (``extra_info.category``: a key of a key); an InputError naming
    the line of one that is not such a row (``name``: the source's name in it)."""
    rows = []
    for number, row in numbered_rows(path):
        if row.get("data_source", data_source) != data_source:
            continue
        if not all(_holds(row, key.split(".")) for key in needs):
            raise InputError(f"{path} line {number} is not a {name} episode row with {' and '.join(needs)}")
        rows.append(row)
    return rows


def _holds(row: dict, keys: list[str]) -> bool:
    return isinstance(row, dict) and keys[0] in row and (len(keys) == 1 or _holds(row[keys[0]], keys[1:]))
