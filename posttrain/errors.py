"""posttrain's own errors, whose message says what happened and what to do, and :class:`Problem`, one
setting that cannot work.

Every error posttrain raises for a person to read is a :class:`PosttrainError`. The ``posttrain``
command prints one as one line (``posttrain: <message>``; ``cli/report.py`` is the one place that
does) and exits with its ``exit_code``: 2 when something to fix comes first (a setting, an input, a
service), 1 when a started run broke off (the message names what resumes it). ``train`` and ``sft``
keep its traceback in the run's log file (``<run dir>/posttrain.log``). Any other exception is a bug
and keeps its traceback on the console. A new kind of error subclasses :class:`PosttrainError` (or one
below) and is shown the same way with no change to the CLI; where callers also catch it as a
``ValueError``, ``KeyError`` or ``FileNotFoundError`` it keeps that as a second base
(:class:`InvalidSettings`, :class:`InputError`, :class:`MissingFileError`).

The kinds:

    InvalidSettings, ConfigError   settings that cannot work, every problem at once (exit 2)
    InputError                     a data file, dataset option, corpus, tool or reward file that cannot
                                   be used (exit 2); PromptTooLongError is one
    MissingFileError               a file or directory a person named is not there (exit 2)
    MissingLibraryError            an optional library a feature needs is not installed; the message
                                   says what needs it and how to install it (exit 2; import_optional)
    ProcessLost                    a process of the run died or hung (a worker, a generator, a
                                   service the run started): a restart from the last checkpoint may
                                   cure it (exit 1)

Restarts. An error is restartable when it is a :class:`ProcessLost` or was raised from one
(``raise ... from err``: its ``__cause__`` chain holds one), as :func:`is_restartable` decides; with
``trainer.max_restarts`` the run starts its workers again from the last checkpoint instead of stopping
(``trainer/run.py``'s ``fit_with_restarts``). A wrapper (an async generator's failure, the run's
checkpoint-then-stop) chains its cause and never copies a flag.

Settings are judged where they are used, and every problem is reported at once, as data: an engine
refuses its settings with :class:`InvalidSettings` naming its own fields (``lr``); the config's checks
(``config/validate.py``, ``cli/preflight.py``) name config keys (``actor_rollout_ref.actor.optim.lr``),
and the config loader raises :class:`ConfigError`, each problem labelled with where its key was set.
This module imports only the standard library, so that every layer may import it.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PosttrainError(RuntimeError):
    """An error whose message is complete for a user: cause and fix, no traceback needed.
    ``exit_code``: 1, a started run broke off; a subclass that means "fix something first" sets 2."""

    exit_code = 1


class InputError(PosttrainError, ValueError):
    """Something a person gave posttrain cannot be used (a data file, a dataset option, a corpus, a tool,
    a reward file, an environment); the message names it and the fix. Exit code 2; still a ValueError."""

    exit_code = 2


class MissingFileError(PosttrainError, FileNotFoundError):
    """A file or directory a person named (data, a checkpoint, an episodes file, a model) is not there.
    Exit code 2; still a FileNotFoundError."""

    exit_code = 2


class MissingLibraryError(PosttrainError):
    """An optional library a feature needs (bfcl-eval, reasoning-gym, textarena, ...) is not installed;
    the message says what needs it and how to install it. Exit code 2. Raised by :func:`import_optional`."""

    exit_code = 2


def import_optional(module: str, *, package: str, needed_by: str, hint: str) -> types.ModuleType:
    """``importlib.import_module(module)``; where the library itself (``module``'s top package) is missing,
    a :class:`MissingLibraryError` instead: "<needed_by>, and <package> is not installed; <hint>". A
    missing module *inside* an installed library (a dependency of its own) is re-raised as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == module.split(".")[0]:
            raise MissingLibraryError(f"{needed_by}, and {package} is not installed; {hint}") from None
        raise


class PromptTooLongError(InputError):
    """A prompt does not fit: longer than ``data.max_prompt_length`` (with ``data.truncation=error``), or
    than an engine's context (``max_model_len``)."""


class ProcessLost(PosttrainError):
    """A process of the run died or hung (a worker, a generator, a service the run started); a restart
    from the last checkpoint may cure it (``trainer.max_restarts``). The one restartable base."""


class ServiceDiedError(ProcessLost):
    """A service the run started for itself (the retriever) exited while the run needed it."""


def is_restartable(err: BaseException) -> bool:
    """``err`` is a :class:`ProcessLost`, or was raised from one (its ``__cause__`` chain holds one)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ProcessLost):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


@dataclass(frozen=True)
class Problem:
    """One setting that cannot work: ``key`` (a config key, or an engine's field), its ``value``, what to
    do (``message``), and where the value came from (``source``: a YAML file, ``command line``,
    ``default``; empty where the checker cannot know, and the config loader fills it in)."""

    key: str
    value: Any
    message: str
    source: str = ""

    def __str__(self) -> str:
        if self.source:
            return f"{self.key} = {self.value!r} (from {self.source}): {self.message}"
        return f"{self.key}={self.value!r}: {self.message}"


class InvalidSettings(PosttrainError, ValueError):
    """Every problem of one settings object (``owner``, e.g. ``TrainingEngineConfig``), reported together.

    Exit code 2: fix the settings, then run again. It stays a ``ValueError`` (a value that cannot work)."""

    exit_code = 2

    def __init__(self, owner: str, problems: Sequence[Problem]) -> None:
        self.owner, self.problems = owner, list(problems)
        super().__init__(self._message())

    def _message(self) -> str:
        return f"Invalid {self.owner}: " + "; ".join(str(p) for p in self.problems) + "."

    def __reduce__(self) -> tuple:
        # Rebuilt from its problems, not its message, when it comes back pickled from a worker.
        return type(self), (self.owner, self.problems)


class ConfigError(InvalidSettings):
    """Every problem of a run's config, one per line, each naming the key, the value, where it was set
    and the fix."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("config", problems)

    def _message(self) -> str:
        lines = "".join(f"\n  {p}" for p in self.problems)
        return f"{len(self.problems)} problem(s) in the config:{lines}"

    def __reduce__(self) -> tuple:
        return type(self), (self.problems,)


def read_utf8(path: Path) -> str:
    """The text of a file a person gave; one that is not UTF-8 text is an :class:`InputError` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path} is not UTF-8 text ({err}); give a JSON or JSON-lines file") from err
