"""Dataset preparers: write a named dataset as verl-format Parquet (``posttrain prepare NAME --out DIR``).

A preparer is a function ``(out_dir: Path, *, option=default, ...) -> list[Path]`` registered in
:data:`PREPARERS`. Its keyword options are its documentation: :func:`parse_options` turns
``key=value`` strings from the command line into them, using the options' type annotations.

Its module also has ``checked_options(given: dict) -> ...``: the refusals the preparer makes from its options
alone, before it reads a file or builds a row. It takes the preparer's keyword arguments, defaults filled in, and
raises InputError (returning what it parsed, for the preparer). The preparer calls it on its own arguments first;
:func:`check_options` calls it without preparing, for the config check (cli/preflight.py, a recipe before its
stages), so the two cannot drift apart.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.data.preparers.options import check_output_dir
from posttrain.errors import InputError, PosttrainError

Preparer = Callable[..., list[Path]]
# name -> "module:function", imported when that dataset is asked for: the doctor's and BFCL's preparers
# bring their environments (and a web framework) with them, which a run on another dataset never needs
PREPARERS: dict[str, str] = {
    "gsm8k": "posttrain.data.preparers.gsm8k:prepare_gsm8k",
    "arithmetic": "posttrain.data.preparers.arithmetic:prepare_arithmetic",
    "synthetic-search": "posttrain.data.preparers.synthetic_search:prepare_synthetic_search",
    "synthetic-doctor": "posttrain.data.preparers.synthetic_doctor:prepare_synthetic_doctor",
    "doctor": "posttrain.data.preparers.doctor_json:prepare_doctor",
    "tool-arithmetic": "posttrain.data.preparers.tool_arithmetic:prepare_tool_arithmetic",
    "bfcl": "posttrain.data.preparers.bfcl:prepare_bfcl",
    "reasoning-gym": "posttrain.data.preparers.reasoning_gym:prepare_reasoning_gym",
    "textarena": "posttrain.data.preparers.textarena:prepare_textarena",
}
# the option a preparer that reads an input file takes it in (``--in FILE`` on the command line)
SOURCE_FILE_OPTION = "source_file"


def preparer_names() -> list[str]:
    return sorted(PREPARERS)


def get_preparer(name: str) -> Preparer:
    if name not in PREPARERS:
        raise InputError(f"unknown dataset {name!r}; the preparers are {preparer_names()}")
    module, function = PREPARERS[name].split(":")
    return getattr(importlib.import_module(module), function)


def describe_options(name: str) -> str:
    """The options of preparer ``name`` with their defaults, e.g. ``"train_size=2000, seed=0"``
    (``"source_file (required), ..."`` for one without a default)."""
    parameters = list(inspect.signature(get_preparer(name)).parameters.values())[1:]
    return ", ".join(f"{p.name} (required)" if p.default is p.empty else f"{p.name}={p.default!r}" for p in parameters)


def reads_source_file(name: str) -> bool:
    """Whether preparer ``name`` reads an input file (has the :data:`SOURCE_FILE_OPTION` option)."""
    return SOURCE_FILE_OPTION in inspect.signature(get_preparer(name)).parameters


def prepare(name: str, out_dir: str | Path, **options: Any) -> list[Path]:
    """Write dataset ``name`` into ``out_dir``; returns the Parquet files written. InputError, before
    anything is written, for bad options or an ``out_dir`` that cannot be written; after, for a write
    that failed (a full disk)."""
    preparer = get_preparer(name)
    _bind(name, preparer, Path(out_dir), options)
    check_output_dir(Path(out_dir))
    try:
        return preparer(Path(out_dir), **options)
    except PosttrainError:
        raise
    except OSError as error:  # a write that failed after the checks
        raise InputError(f"--out {out_dir}: writing dataset {name!r} failed ({error}); free space or pass --out another directory") from error


def check_options(name: str, options: dict[str, Any]) -> None:
    """InputError for what ``prepare(name, ..., **options)`` would refuse before reading a file: an unknown dataset
    or option, and what the preparer's own ``checked_options`` finds (module docstring), without preparing anything."""
    bound = _bind(name, get_preparer(name), Path("."), options)
    bound.apply_defaults()
    checked_options = importlib.import_module(PREPARERS[name].split(":")[0]).checked_options
    try:
        checked_options({key: value for key, value in bound.arguments.items() if key != "out_dir"})
    except InputError:
        raise  # the preparer's own refusal, as it words it
    except (TypeError, ValueError, AttributeError) as error:  # an option of another type than the preparer reads
        raise InputError(f"bad options {options} for dataset {name!r}: {error}; its options are: {describe_options(name)}") from None


def _bind(name: str, preparer: Preparer, out_dir: Path, options: dict[str, Any]) -> inspect.BoundArguments:
    try:
        return inspect.signature(preparer).bind(out_dir, **options)
    except TypeError as error:
        raise InputError(f"bad options {sorted(options)} for dataset {name!r} ({error}); its options are: {describe_options(name)}") from None


def parse_options(name: str, assignments: Sequence[str]) -> dict[str, Any]:
    """``["train_size=100", "operators=+-"]`` → ``{"train_size": 100, "operators": "+-"}`` for preparer ``name``.

    Values are converted to the option's annotated type (int, float, bool, str, Path; ``none`` for
    an optional one).
    """
    preparer = get_preparer(name)
    hints = typing.get_type_hints(preparer)
    options: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or key not in hints or key == "return" or key == "out_dir":
            raise InputError(f"expected key=value with a key among: {describe_options(name)}; got {assignment!r}")
        options[key] = _convert(text, hints[key], key)
    return options


def _convert(text: str, hint: Any, key: str) -> Any:
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
    if type(None) in typing.get_args(hint) and text.lower() in ("none", "null"):
        return None
    kind = kinds[0]
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise InputError(f"{key}={text!r}: expected true or false")
        return text.lower() in ("true", "1")
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise InputError(f"{key}={text!r}: expected a value of type {getattr(kind, '__name__', kind)}") from None


__all__ = ["PREPARERS", "SOURCE_FILE_OPTION", "Preparer", "describe_options", "get_preparer", "parse_options", "prepare",
           "preparer_names", "reads_source_file"]
