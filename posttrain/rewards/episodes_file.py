"""Episodes files (``posttrain eval --dump-episodes``, a run's ``validation/step_N.jsonl``) read back: every
row with its line number (what ``posttrain compare`` and the recipes' tables read), the rows of one data
source (what the reports of mistakes by kind read), and the scripts' ``LABEL=FILE`` arguments read by label."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from posttrain.errors import InputError, PosttrainError, read_utf8

T = TypeVar("T")


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


def read_labelled(arguments: Sequence[str], script: str, usage: str, read: Callable[[str], T]) -> dict[str, T]:
    """A script's ``LABEL=VALUE`` arguments, each value read by ``read``, by label in the order given. SystemExit with
    ``usage`` when there are none or one has no "=", naming a label given twice, or ``script: the error`` when a read
    fails (an InputError or the file's OSError)."""
    if not arguments or any("=" not in a for a in arguments):
        raise SystemExit(usage)
    labels = [a.split("=", 1)[0] for a in arguments]
    if len(set(labels)) < len(labels):
        raise SystemExit(f"{script}: a label given twice ({', '.join(sorted({x for x in labels if labels.count(x) > 1}))}): one per argument")
    try:
        return {label: read(value) for label, value in (a.split("=", 1) for a in arguments)}
    except (PosttrainError, OSError) as error:
        raise SystemExit(f"{script}: {error}") from None


def _holds(row: dict, keys: list[str]) -> bool:
    return isinstance(row, dict) and keys[0] in row and (len(keys) == 1 or _holds(row[keys[0]], keys[1:]))
