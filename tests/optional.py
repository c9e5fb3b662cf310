"""What a test file needs that is not always installed: an optional library (several come with
``--no-deps`` installs, so one of *their* dependencies can be the missing piece) or the bubblewrap sandbox.

Outside CI a missing one skips, naming what is missing and how to install it. Under CI (``CI=true``)
nothing that should run may skip: the same absence fails with that reason (docs/testing.md)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    """CI's own environment variable (GitHub Actions, GitLab and most others set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing(reason: str) -> None:
    """Skip (fail under CI) because something a test needs is missing; callable at module level."""
    if in_ci():
        pytest.fail(f"CI=true and this must run here, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, install: str) -> ModuleType:
    """Import ``module`` or skip (fail under CI) with the import error itself, which names the missing
    piece even when it is a dependency of the library (``No module named 'fastmcp'``), and ``install``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        problem = f"{module} cannot be imported ({type(error).__name__}: {error}); {install}"
    missing(problem)  # outside the except clause: the reason alone, not the import's traceback chained to it
