"""Environments by name: the built-ins, or a user's class from their own file or module. It lives above
agents/ and tools/ (the built-ins come from both), each built-in imported by its module's name only when
used, so that an optional library (textarena, openenv) is needed only by a run of its environment.

    env.name: search                                   # a built-in
    env.name: my_game, env.path: my_envs.py, env.class_name: MyGame   # a user's class

A class is constructed once per episode as ``cls(**env.options, **resources)``, where resources
are the shared objects its constructor asks for by parameter name (``retriever``: the search
client the trainer connected or started; ``env_llm``: the Env-LLM client, agents/env_llm.py). A class
whose options decide whether it needs a resource says so in ``needed_resources(options)``. Its options are checked against its constructor before
any episode runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from posttrain.agents.env import Environment
from posttrain.errors import InputError

BUILTIN_ENVS = {
    "search": ("posttrain.agents.search", "SearchEnv"), "doctor": ("posttrain.agents.doctor", "DoctorEnv"),
    "tools": ("posttrain.tools.env", "ToolEnv"),
    "openenv": ("posttrain.agents.openenv_env", "OpenEnvEnv"),  # a running OpenEnv server (docs/environments.md)
    "textarena": ("posttrain.agents.textarena_env", "TextArenaEnv"),  # TextArena's one-player text games (docs/environments.md)
    "program": ("posttrain.agents.program_host", "ProgramEnv"),  # a user's own agent program (docs/programs.md, rollout/program.py)
}
# shared objects the trainer can hand to environments, by parameter name: the search client, the
# environment's language model (agents/env_llm.py) that a patient, a simulated user or a judge speaks
# through, and the run's tools (posttrain/tools: env.tools, env.mcp_servers)
RESOURCES = {"retriever", "env_llm", "toolbox"}


def builtin_env_names() -> list[str]:
    return sorted(BUILTIN_ENVS)


def load_env_class(name: str, path: str | None = None, class_name: str | None = None) -> type[Environment]:
    """The class for ``env.name`` (built-in), or ``class_name`` from ``path`` (a .py file or a module)."""
    if path is None:
        if name not in BUILTIN_ENVS:
            raise InputError(
                f"env.name={name!r} is not a built-in environment ({', '.join(builtin_env_names())}); for your own, "
                "set env.path (a .py file or an importable module) and env.class_name"
            )
        module_name, class_name = BUILTIN_ENVS[name]
        module = importlib.import_module(module_name)
    else:
        if not class_name:
            raise InputError(f"env.path={path!r} needs env.class_name: the Environment subclass to load from it")
        module = _import(path)
    env_class = getattr(module, class_name, None)
    if not (inspect.isclass(env_class) and issubclass(env_class, Environment)):
        raise InputError(f"{class_name!r} in {path or module.__name__} is not a subclass of posttrain.agents.Environment")
    return env_class


def _import(path: str) -> Any:
    if path.endswith(".py"):
        file = Path(path)
        if not file.is_file():
            raise InputError(f"env.path={path!r}: no such file")
        spec = importlib.util.spec_from_file_location(f"posttrain_user_env_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(path)
    except ImportError as error:
        raise InputError(f"env.path={path!r}: cannot import it ({error}); give a .py file or an importable module") from error


def check_options(env_class: type[Environment], options: Mapping[str, Any], resource_names: Iterable[str]) -> None:
    """Raise ValueError unless ``env_class(**options, **resources)`` can be called (names only)."""
    parameters = inspect.signature(env_class).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    resource_names = set(resource_names)
    unknown = [key for key in options if key not in parameters and not takes_any]
    if unknown:
        accepted = [p for p in parameters if p not in resource_names and parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
        raise InputError(f"env.options {unknown} are not options of {env_class.__name__}; it accepts {accepted}")
    given = set(options) | (resource_names & set(parameters))
    missing = [
        name for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        and name not in given
    ]
    if missing:
        raise InputError(f"cannot construct {env_class.__name__}: it needs {missing}; set them as env.options")


def wanted_resources(env_class: type[Environment], options: Mapping[str, Any] | None = None) -> set[str]:
    """The shared resources (of :data:`RESOURCES`) that ``env_class`` built with ``options`` uses:
    those its constructor asks for, narrowed by its ``needed_resources(options)``."""
    taken = RESOURCES & set(inspect.signature(env_class).parameters)
    needed = env_class.needed_resources(options or {})
    return taken if needed is None else taken & set(needed)


def env_factory(env_class: type[Environment], options: Mapping[str, Any], resources: Mapping[str, Any]) -> Callable[[], Environment]:
    """A function making one environment per call; bad options fail here, naming the accepted ones."""
    check_options(env_class, options, resources)
    wanted = {name: value for name, value in resources.items() if name in inspect.signature(env_class).parameters}
    arguments = {**options, **wanted}
    return lambda: env_class(**arguments)


def probe_environment(env_class: type[Environment], options: Mapping[str, Any]) -> Environment:
    """One environment built from ``options`` with stand-ins for its resources, to check option names
    and values before any worker starts; raises ValueError naming what is wrong."""
    resources = wanted_resources(env_class, options)
    check_options(env_class, options, resources)
    return env_factory(env_class, options, {name: _StandIn(name) for name in resources})()


class _StandIn:
    """Takes a shared resource's place when an environment is built only to check its options."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        raise RuntimeError(f"the stand-in for {self.name!r} was used; environments must not call resources in __init__")
