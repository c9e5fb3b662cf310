"""Reading a retrieval corpus: JSON lines in Search-R1's format.

Each non-blank line is one document, ``{"id": "0", "contents": "\\"Title\\"\\ntext"}``. The id may be
a JSON string or integer and is kept as a string; ``contents`` must be a non-empty string. Blank lines
are skipped. Anything else is refused rather than guessed at: a line that is not a JSON object, a
missing or non-string id, missing or empty ``contents``, or an id seen before. All problems are
collected in one pass and reported together in a ``CorpusError`` that names the file, the first few
bad line numbers with what is wrong on each, and what a valid line looks like. A missing or empty
file is a ``CorpusError`` too.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.errors import InputError
from posttrain.agents.retriever.types import Document

VALID_LINE = '{"id": "0", "contents": "\\"Title\\"\\ntext of the passage"}'
_SHOWN_PROBLEMS = 5


class CorpusError(InputError):
    """The corpus file cannot be used; the message names the file, the bad lines and the fix."""


def load_corpus(path: str | Path) -> list[Document]:
    """Every document of a JSON-lines corpus, in file order; raises ``CorpusError`` on any bad line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist: pass the path of a JSON-lines file, one document a line, like {VALID_LINE}")
    documents: list[Document] = []
    first_line_of_id: dict[str, int] = {}
    problems: list[str] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            document, problem = _parse_line(line)
            if document is not None and document.id in first_line_of_id:
                problem = f"duplicate id {document.id!r} (first on line {first_line_of_id[document.id]})"
            if problem is not None:
                problems.append(f"line {number}: {problem}")
                continue
            first_line_of_id[document.id] = number
            documents.append(document)
    if problems:
        raise CorpusError(_problems_message(path, problems))
    if not documents:
        raise CorpusError(f"corpus file {path} holds no documents: write one JSON object a line, like {VALID_LINE}")
    return documents


def _parse_line(line: str) -> tuple[Document | None, str | None]:
    """The line's document, or None and what is wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(record, dict):
        return None, f"not a JSON object (a {type(record).__name__})"
    doc_id = record.get("id")
    # bool is an int subclass in Python; an id of true/false is a mistake, not an id.
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        return None, '"id" is missing or not a non-empty string or integer'
    contents = record.get("contents")
    if not isinstance(contents, str) or not contents.strip():
        return None, '"contents" is missing or empty'
    return Document(id=str(doc_id), contents=contents), None


def _problems_message(path: Path, problems: list[str]) -> str:
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = f" (and {len(problems) - _SHOWN_PROBLEMS} more)" if len(problems) > _SHOWN_PROBLEMS else ""
    return (
        f"corpus file {path} has {len(problems)} bad line(s): {shown}{more}. "
        f"Fix or remove them; each line must be a JSON object like {VALID_LINE}"
    )
