"""The base of posttrain's own errors: ones whose message says what happened and what to do.

``posttrain train`` prints such an error as one line (``posttrain: <message>``), keeps its traceback
in the run's log file (``<run dir>/posttrain.log``) and exits with the error's ``exit_code``: 2 when
something to fix comes first (a setting, an input, the cluster), 1 when a started run broke off (the
message names what resumes it). A new kind of error that meets that bar subclasses
:class:`PosttrainError` and is shown the same way with no change to the CLI.
"""

from __future__ import annotations


class PosttrainError(RuntimeError):
    """An error whose message is complete for a user: cause and fix, no traceback needed."""

    exit_code = 1
