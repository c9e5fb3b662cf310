"""The ``posttrain`` command and its glue around the library: the argument parser and each command
(``cli/main.py``), a run's start and end as a user sees them (``cli/train.py``: Ray up and down, an
error as one line, a stop's resume command, the closing summary), the config's preflight
(``cli/preflight.py``), the one place an error is printed (``cli/report.py``), ``posttrain eval`` (``cli/evaluate.py``), ``compare`` (``cli/compare.py``)
and ``export`` (``cli/export.py``). Nothing below this package imports it."""

from posttrain.cli.main import main

__all__ = ["main"]
