"""An engine's settings that cannot work, as data: each problem names the field, its value and the fix.

The engines raise :class:`InvalidSettings` when built with such settings; the config validator
(``config/validate.py``) builds the same settings from the config before any worker starts and turns
each problem into a message naming the config key — so the rules live once, beside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SettingProblem:
    field: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.message}"


class InvalidSettings(ValueError):
    """Every problem of one settings object (``owner``), reported together."""

    def __init__(self, owner: str, problems: Sequence[SettingProblem]) -> None:
        self.problems = list(problems)
        super().__init__(f"Invalid {owner}: " + "; ".join(str(p) for p in self.problems) + ".")
