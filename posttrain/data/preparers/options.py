"""Checks of a preparer's arguments, shared so that every preparer refuses a bad one the same way:
naming the argument, its value and the fix, before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

from posttrain.errors import InputError


def check_counts(at_least: int, **counts: int) -> None:
    """Raise ValueError for the first of ``counts`` (option name → value) below ``at_least``."""
    for key, value in counts.items():
        if value < at_least:
            also = " (0 writes none)" if at_least == 0 else ""
            raise InputError(f"{key}={value}: must be at least {at_least}{also}; pass {key}=N with N >= {at_least}")


def check_output_dir(out_dir: Path) -> None:
    """Raise ValueError unless files can be written into ``out_dir`` (``--out``), which may not exist yet:
    it must not be a file or lie under one, and its nearest existing folder must be writable."""
    existing = out_dir.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == out_dir.absolute() else f"lies under {existing}, which is a file"
        raise InputError(f"--out {out_dir} {where}; pass --out a directory (it is created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"--out {out_dir}: {existing} is not writable by this user; pass --out a directory you can write to")
