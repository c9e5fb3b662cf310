"""posttrain's own errors, whose message says what happened and what to do, and :class:`Problem`, one
setting that cannot work.

``posttrain train`` prints such an error as one line (``posttrain: <message>``), keeps its traceback
in the run's log file (``<run dir>/posttrain.log``) and exits with the error's ``exit_code``: 2 when
something to fix comes first (a setting, an input, the cluster), 1 when a started run broke off (the
message names what resumes it). A new kind of error that meets that bar subclasses
:class:`PosttrainError` and is shown the same way with no change to the CLI.

Settings are judged where they are used, and every problem is reported at once, as data: an engine
refuses its settings with :class:`InvalidSettings` naming its own fields (``lr``); the config's checks
(``config/validate.py``, ``cli/preflight.py``) name config keys (``actor_rollout_ref.actor.optim.lr``),
and the config loader raises :class:`ConfigError`, each problem labelled with where its key was set.
This module imports only the standard library, so that every layer may import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class PosttrainError(RuntimeError):
    """An error whose message is complete for a user: cause and fix, no traceback needed.

    ``restartable``: a process of the run died or hung (a worker, a generator, a service the run
    started); with ``trainer.max_restarts`` the run starts its workers again from the last checkpoint
    instead of stopping (trainer/run.py's fit_with_restarts)."""

    exit_code = 1
    restartable = False


class ServiceDiedError(PosttrainError):
    """A service the run started for itself (the retriever) exited while the run needed it."""

    restartable = True


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
