"""A user's own score function, loaded from a .py file by path (``custom_reward_function.path``/``.name``).

:class:`FileScoreFunction` loads the file when it is made (so a wrong path or name fails at start-up,
not mid-run) and binds ``reward_kwargs``. It travels to another process as just ``(path, name,
kwargs)`` and loads the file again there on first use, so it works in the reward manager's scoring
process and on Ray workers (the file must exist on that machine too).

The function is called with keyword arguments only: ``solution_str`` and ``ground_truth`` (or, when
``batched``, ``solution_strs`` and ``ground_truths``, lists), plus ``data_source``/``extra_info``
(``data_sources``/``extra_infos``) if it accepts them, plus ``reward_kwargs``. So verl's
``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` works unchanged.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posttrain.errors import InputError, MissingFileError
from posttrain.rewards.registry import (
    BATCHED_CONTEXT_KEYWORDS,
    BATCHED_REQUIRED_KEYWORDS,
    CONTEXT_KEYWORDS,
    REQUIRED_KEYWORDS,
    check_callable_with,
)

# One module object per (file, modification time) per process: loading is paid once, and an edited
# file is picked up by a new manager.
_LOADED: dict[tuple[str, int], Any] = {}


class CustomRewardError(InputError):
    """The custom reward file cannot be loaded or lacks the named function; the message says the fix.

    Deliberately not an AttributeError: ``inspect.signature`` would swallow one raised while it
    reads :attr:`FileScoreFunction.__signature__` and quietly report a catch-all signature.
    """


class FileScoreFunction:
    """Function ``name`` from the Python file ``path``, with ``kwargs`` bound."""

    def __init__(self, path: str | Path, name: str = "compute_score", kwargs: Mapping[str, Any] | None = None, *, batched: bool = False) -> None:
        self.path = Path(path).expanduser().resolve()
        self.name = name
        self.kwargs = dict(kwargs or {})
        self.batched = batched
        load_function(self.path, name)  # fail now, with the loader's message, if the file or function is missing
        label = f"{name!r} from {self.path}"
        if batched:
            check_callable_with(self, label, BATCHED_REQUIRED_KEYWORDS, BATCHED_CONTEXT_KEYWORDS)
        else:
            check_callable_with(self, label, REQUIRED_KEYWORDS, CONTEXT_KEYWORDS)

    @property
    def function(self) -> Callable[..., Any]:
        return load_function(self.path, self.name)

    def __call__(self, **arguments: Any) -> Any:
        return self.function(**arguments, **self.kwargs)

    @property
    def in_process(self) -> bool:
        """The loaded function asks a service from this process (``in_process = True`` on it; posttrain/deadlines.py)."""
        return bool(getattr(self.function, "in_process", False))

    @property
    def __signature__(self) -> inspect.Signature:
        """The loaded function's signature without the bound kwargs (what callers still pass)."""
        signature = inspect.signature(self.function)
        unknown = [k for k in self.kwargs if k not in signature.parameters]
        if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
            raise TypeError(
                f"reward_kwargs {unknown} are not parameters of {self.name!r} in {self.path} "
                f"(it takes {list(signature.parameters)}); fix custom_reward_function.reward_kwargs"
            )
        return signature.replace(parameters=[p for n, p in signature.parameters.items() if n not in self.kwargs])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "kwargs": self.kwargs, "batched": self.batched}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"FileScoreFunction({str(self.path)!r}, {self.name!r}, kwargs={self.kwargs!r}, batched={self.batched})"


def load_function(path: Path, name: str) -> Callable[..., Any]:
    """Function ``name`` defined in the Python file ``path``; errors say what is missing."""
    if not path.is_file():
        raise MissingFileError(
            f"custom reward file {path} does not exist; set custom_reward_function.path to an existing .py file"
        )
    module = _load_module(path)
    function = getattr(module, name, None)
    if not callable(function):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise CustomRewardError(
            f"{path} defines no function {name!r} (it defines {defined}); set custom_reward_function.name to one of them"
        )
    return function


def _load_module(path: Path) -> Any:
    try:
        return load_source_file(path, "posttrain_user_reward_")
    except NotPythonError:
        raise CustomRewardError(f"cannot load {path} as Python; custom_reward_function.path must name a .py file") from None
    except Exception as error:
        raise CustomRewardError(f"running custom reward file {path} failed: {type(error).__name__}: {error}") from error


class NotPythonError(InputError):
    """A file that importlib cannot load as Python source."""


def import_source(source: str, prefix: str, error: type[InputError], what: str) -> Any:
    """The module ``source`` names: a .py file (run once by :func:`load_source_file`) or an importable
    module. What is wrong (no such file, the file raised, no such module) is an ``error`` whose message
    starts with ``what`` (e.g. "tool file my_tools.py")."""
    if not source.endswith(".py"):
        try:
            return importlib.import_module(source)
        except ImportError as problem:
            raise error(f"{what}: module {source!r} cannot be imported ({problem}); give a .py file or an importable module") from None
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise error(f"{what}: no such file (looked at {path})")
    try:
        return load_source_file(path, prefix)
    except Exception as problem:
        raise error(f"running {what} failed: {type(problem).__name__}: {problem}") from None


def load_source_file(path: Path, prefix: str) -> Any:
    """The module of the user's Python file ``path`` (a reward function's, a tool's), run once per
    version of the file; what the file raises when run propagates. The module gets a name of its own,
    ``prefix`` + a hash of the path (two files both called tools.py must not collide), registered in
    ``sys.modules`` so that the file's own dataclasses and pickling find it."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:
        module_name = prefix + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise NotPythonError(f"cannot load {path} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        _LOADED[key] = module
    return _LOADED[key]
