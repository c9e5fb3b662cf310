"""Reading a config: defaults ← preset YAML ← ``key=value`` overrides, then its checks.

Every problem — an unknown key, a value of the wrong type, a rule broken — is collected and reported
together in one :class:`~posttrain.errors.ConfigError`, each with the key, the value, where it came
from and what to do. The rules are :mod:`validate`'s (the config's own) unless the caller passes
others: ``cli/preflight.py`` passes every rule of the command that will run.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import validate_config
from posttrain.errors import ConfigError, Problem

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_PRESET = "arithmetic_grpo"  # train's and eval's preset when none is named (cli/main.py, recipes/checks.py)
Checks = Callable[[PosttrainConfig], list[Problem]]


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError([Problem("--preset", name, f"no such preset; choose one of {preset_names()}", source="command line")])
    return path


def load_config(
    yaml_files: Iterable[str | Path] = (), overrides: Sequence[str] = (), checks: Checks | None = validate_config,
    overrides_source: str = "command line",
) -> PosttrainConfig:
    """Defaults, then each YAML file, then dotted ``key=value`` overrides; all problems at once: the
    loader's own (files, unknown keys, types) and those ``checks`` finds in the result (None: none).
    A command's whole set of checks is ``cli.preflight.check_config``.

    A value of the wrong type keeps the key's earlier value, and the checks still run, so a type
    error never hides a value error elsewhere. Each problem says where its key was last set: a file,
    ``overrides_source`` (``command line``; a recipe names its stage's overrides), or ``default``.
    """
    merged = OmegaConf.structured(PosttrainConfig)
    problems: list[Problem] = []
    sources: dict[str, str] = {}
    for path in yaml_files:
        path = Path(path)
        if not path.exists():
            problems.append(Problem("config file", str(path), "file not found", source="command line"))
            continue
        try:
            loaded = OmegaConf.load(path)
        except (OmegaConfBaseException, yaml.YAMLError) as err:
            problems.append(Problem("config file", str(path), f"not valid YAML: {str(err).splitlines()[0]}", source=str(path)))
            continue
        problems += _apply(merged, _flatten(loaded), str(path), sources)
    problems += _apply(merged, _parse_overrides(overrides, problems, overrides_source), overrides_source, sources)
    try:
        config: PosttrainConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:  # e.g. a ${...} interpolation pointing nowhere
        raise ConfigError([*problems, Problem("interpolation", "", str(err).splitlines()[0], source="config")]) from err
    if checks is not None:
        reported = {_field_key(p.key) for p in problems}
        found = checks(config)
        problems += [_with_source(p, sources) for p in _unique(found) if _field_key(p.key) not in reported]
    if problems:
        raise ConfigError(problems)
    return config


def _unique(problems: list[Problem]) -> list[Problem]:
    """Each problem once (two engines built from the same keys report the same mistake)."""
    seen: set[tuple[str, str]] = set()
    return [p for p in problems if (p.key, p.message) not in seen and not seen.add((p.key, p.message))]


def _with_source(problem: Problem, sources: dict[str, str]) -> Problem:
    """A check's problem labelled with where its key was set (checks only know the key)."""
    if problem.source:
        return problem
    key = _field_key(problem.key)
    key = "mixture" if key.startswith("mixture[") else key  # a source's key: where the mixture (a list, set whole) was set
    # a section's key (data.builtin_options): wherever a key beneath it was set
    beneath = ", ".join(dict.fromkeys(source for name, source in sources.items() if name.startswith(key + ".")))
    return replace(problem, source=sources.get(key) or beneath or "default")


ASYNC_SECTION = ("async", "async_")  # what users write, and the field's name (``async`` is a Python keyword)


def to_yaml(config: PosttrainConfig) -> str:
    tree = OmegaConf.to_container(OmegaConf.structured(config), resolve=False)
    tree = {ASYNC_SECTION[0] if key == ASYNC_SECTION[1] else key: value for key, value in tree.items()}
    return OmegaConf.to_yaml(OmegaConf.create(tree))


def _field_key(key: str) -> str:
    """``async.x`` → ``async_.x`` (both spellings are accepted)."""
    head, dot, rest = key.partition(".")
    return f"{ASYNC_SECTION[1]}{dot}{rest}" if head == ASYNC_SECTION[0] else key


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted leaves of a YAML tree; lists and empty dicts are leaves."""
    if isinstance(node, DictConfig) and len(node) > 0:
        return [item for k, v in node.items_ex(resolve=False) for item in _flatten(v, f"{prefix}{k}.")]
    value = OmegaConf.to_container(node, resolve=False) if isinstance(node, (DictConfig, ListConfig)) else node
    return [(prefix.rstrip("."), value)]


def _parse_overrides(overrides: Sequence[str], problems: list[Problem], source: str) -> list[tuple[str, Any]]:
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(Problem(item, None, "overrides are key=value, e.g. data.train_batch_size=16", source=source))
            continue
        try:
            # resolve=False keeps ${...} interpolations for the merged config to resolve.
            value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]), resolve=False)["value"] if raw else ""
        except (OmegaConfBaseException, yaml.YAMLError) as err:
            problems.append(Problem(key, raw, f"cannot parse the value: {str(err).splitlines()[0]}", source=source))
            continue
        pairs.append((key.strip(), value))
    return pairs


def _apply(config: DictConfig, pairs: list[tuple[str, Any]], source: str, sources: dict[str, str]) -> list[Problem]:
    """Set each key; ``sources`` records where each key that took its value came from."""
    problems = []
    for key, value in pairs:
        key = _field_key(key)
        if not _key_exists(config, key):
            problems.append(Problem(key, value, _unknown_key_message(config, key), source=source))
            continue
        try:
            OmegaConf.update(config, key, value, merge=False)
        except OmegaConfBaseException as err:
            problems.append(Problem(key, value, _type_message(config, key, err), source=source))
            continue
        sources[key] = source
    return problems


def _key_exists(config: DictConfig, key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            # A dict-typed field (e.g. reward_kwargs) accepts any sub-key.
            return isinstance(node, DictConfig) and node._metadata.object_type in (None, dict)
        node = node._get_node(part)
    return True


def _all_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, DictConfig):
        return [prefix.rstrip(".")]
    keys = [prefix.rstrip(".")] if prefix else []
    for k in node.keys():
        keys += _all_keys(node._get_node(k), f"{prefix}{k}.")
    return keys


def _unknown_key_message(config: DictConfig, key: str) -> str:
    close = difflib.get_close_matches(key, _all_keys(config), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "run `posttrain config` to list every key"
    return f"unknown key; {hint}"


def _type_message(config: DictConfig, key: str, err: OmegaConfBaseException) -> str:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
    expected = getattr(getattr(node, "_metadata", None), "ref_type", None)
    name = getattr(expected, "__name__", None) or str(expected).replace("typing.", "")
    first_line = str(err).splitlines()[0]
    return f"wrong type, expected {name}: {first_line}" if expected else first_line
