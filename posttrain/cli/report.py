"""The one place the ``posttrain`` command shows an error: a :class:`~posttrain.errors.PosttrainError`
as one line on stderr, ``posttrain: <message>``, and its exit code (2: fix something first; 1: a started
run broke off). :func:`~posttrain.cli.main.main` reports what any command raises; ``train`` and ``sft``
report theirs once the traceback is in the run's log file, and name that file. Any other exception is
a bug and keeps its traceback."""

from __future__ import annotations

import sys
from pathlib import Path

from posttrain.errors import PosttrainError


def report_error(err: PosttrainError, traceback_file: Path | None = None) -> int:
    """``err`` as one line on stderr (with where its traceback was kept, if it was); its exit code."""
    kept = f" [traceback: {traceback_file}]" if traceback_file is not None else ""
    print(f"posttrain: {err}{kept}", file=sys.stderr)
    return err.exit_code
