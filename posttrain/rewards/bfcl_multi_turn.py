"""BFCL's multi-turn APIs and its own multi-turn checker, for one episode (data_source ``bfcl_multi_turn``).

BFCL's multi-turn categories (``bfcl-eval==2026.3.23``, installed ``--no-deps``: :mod:`posttrain.rewards.bfcl`)
give the model the API classes of a row (``GorillaFileSystem``, ``TwitterAPI``, ``TradingBot``, ...,
``bfcl_eval/eval_checker/multi_turn_eval/func_source_code``), loaded with the row's ``initial_config``,
and several user turns. This module is the adapter to BFCL's code; nothing of it is re-implemented
(STYLE.md 16):

- :func:`load_instances`: fresh instances of the row's involved classes, made and loaded
  (``_load_scenario(deepcopy(config), long_context=...)``) exactly as BFCL's
  ``execute_multi_turn_func_call`` makes them, but held by the caller, never in that function's
  module-level cache (keyed by model name and row id, which every rollout of a row would share);
- :func:`method_owners`: which instance runs a method name; where two involved classes share a name,
  the later class in ``involved_classes`` wins, as in BFCL's own name table;
- :func:`run_call`: a call on the live instances, its result as text as BFCL turns it into text
  (a str as it is, a dict as JSON, anything else ``str()``; an exception as ``Error during execution: ...``);
- :func:`call_text`: a call ``name`` + arguments as BFCL's decoded form for a function-calling model,
  ``name(k=repr(v),...)`` — the format of ``bfcl_eval.model_handler.utils.convert_to_function_call``,
  written here because that module imports tree_sitter (one of the dependencies left out);
- :func:`check_turns`: BFCL's ``multi_turn_checker`` on the episode's calls, per user turn, per step
  (``list[list[list[str]]]``), preceded by the one check BFCL's runner makes before it
  (``eval_runner._evaluate_single_multi_turn_entry``: as many turns as the ground truth, else
  ``multi_turn:force_terminated``). The checker replays the calls itself on instances of its own and
  compares state and responses after each turn with the ground truth's. It keeps those instances in
  its module's globals under the model name and row id, so each check here uses a model name of its
  own and removes its entries afterwards: two checks in one process never see each other's state.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.rewards.bfcl import Verdict, bfcl_module

_UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
_CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"
_checks = itertools.count()


def load_instances(involved_classes: Sequence[str], initial_config: Mapping[str, Any], *, long_context: bool = False) -> dict[str, Any]:
    """A fresh instance of each involved class, loaded with its part of ``initial_config`` (module docstring)."""
    backend = bfcl_module("bfcl_eval.constants.executable_backend_config")
    instances = {}
    for name in involved_classes:
        if name not in backend.CLASS_FILE_PATH_MAPPING:
            raise ValueError(f"{name!r} is not one of BFCL's API classes ({', '.join(backend.CLASS_FILE_PATH_MAPPING)})")
        instance = getattr(importlib.import_module(backend.CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in backend.STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(dict(initial_config).get(name, {})), long_context=long_context)
        instances[name] = instance
    return instances


def method_owners(instances: Mapping[str, Any]) -> dict[str, str]:
    """Each public method name -> the class whose instance runs it (the later class wins a shared name)."""
    owners = {}
    for class_name, instance in instances.items():
        for method_name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not method_name.startswith("_"):
                owners[method_name] = class_name
    return owners


def run_call(instance: Any, name: str, arguments: Mapping[str, Any]) -> str:
    """``instance.name(**arguments)`` as text, as BFCL turns a result into text (module docstring)."""
    try:
        result = getattr(instance, name)(**arguments)
    except Exception as error:  # BFCL's execution reads an exception as a result, too
        return f"Error during execution: {error}"
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as BFCL's decoded form: ``name(k=repr(v),...)`` (module docstring)."""
    return f"{name}({','.join(f'{key}={value!r}' for key, value in arguments.items())})"


def check_turns(turns: Sequence[Sequence[Sequence[str]]], ground_truth: Sequence[Sequence[str]], entry: Mapping[str, Any]) -> Verdict:
    """BFCL's verdict on an episode's calls (``turns[t][step]``: call strings) against the row's
    ``ground_truth`` (per turn, call strings); ``entry`` holds ``id``, ``initial_config`` and
    ``involved_classes``, as BFCL's test entry does."""
    if len(turns) != len(ground_truth):
        return Verdict(False, "multi_turn:force_terminated",
                       errors=(f"the episode has {len(turns)} user turns' calls, the ground truth {len(ground_truth)}",))
    checker = bfcl_module(_CHECKER).multi_turn_checker
    model_name = f"posttrain{os.getpid()}x{next(_checks)}"
    category = str(entry["id"]).rsplit("_", 1)[0]
    test_entry = {"id": entry["id"], "initial_config": dict(entry["initial_config"]), "involved_classes": list(entry["involved_classes"])}
    try:
        result = checker([[list(step) for step in turn] for turn in turns], [list(turn) for turn in ground_truth],
                         test_entry, category, model_name)
    finally:  # the checker's instances of this check, under its model name (and + "_ground_truth")
        cache = vars(bfcl_module(_UTILS))
        for key in [key for key in cache if key.startswith(model_name + "_")]:
            del cache[key]
    if result["valid"]:
        return Verdict(True)
    return Verdict(False, str(result.get("error_type", "unknown")), errors=(str(result.get("error_message", "")),))


__all__ = ["call_text", "check_turns", "load_instances", "method_owners", "run_call"]
