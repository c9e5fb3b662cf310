"""BFCL's own AST checker as the score function of data_source ``bfcl``.

The Berkeley Function Calling Leaderboard (BFCL, PyPI ``bfcl-eval==2026.3.23``, Apache-2.0) judges a
single-turn function-calling answer with its AST checker
(``bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker``). This module is the adapter to it: it
turns the calls the model wrote into BFCL's model-output form and asks BFCL's code; nothing of the
checker is re-implemented here (STYLE.md 16).

**How the checker is imported.** bfcl-eval pins dependencies that clash with ours (numpy==1.26.4,
tree_sitter, openai, anthropic, mistralai, ...), so ``scripts/setup.sh`` installs it with
``pip install --no-deps``. Its checker module then fails to import: it imports
``bfcl_eval.constants.model_config`` for ``MODEL_CONFIG_MAPPING``, and that module imports every
API model handler (anthropic, tree_sitter, ...). The checker reads the mapping in one place only,
``convert_func_name``, as ``MODEL_CONFIG_MAPPING[model_name].underscore_to_dot`` (whether the model
wrote ``math.factorial`` as ``math_factorial``). So :func:`ast_checker` first tries the real
``bfcl_eval.constants.model_config``; if that import fails, it registers in ``sys.modules`` a small
module of that name whose ``MODEL_CONFIG_MAPPING`` is ``{MODEL_NAME: CheckerModelConfig(underscore_to_dot=False)}``
and then imports the checker, unchanged. (With the real module, the same entry is added to its
mapping.) ``underscore_to_dot=False`` is right for posttrain: the rows' tools keep BFCL's names, dots
included, and the model is judged on writing them as given.

**What a call is judged by**, as BFCL's own runner (``eval_checker/eval_runner.py``) does it:

- ``calls`` (``[{"name": str, "arguments": dict}]`` in the order written) become
  ``[{name: arguments}, ...]``, BFCL's decoded model output;
- irrelevance categories (``irrelevance``, ``live_irrelevance``): right iff BFCL's ``is_empty_output``
  (no call); ``live_relevance``: right iff there is a call;
- every other category: BFCL's ``is_function_calling_format_output`` first (arguments that are not an
  object are ``ast_decoder:decoder_wrong_output_format``), then ``ast_checker(functions, output,
  possible_answer, Language.PYTHON, category, MODEL_NAME)``. The runner passes the category name as the
  checker's ``test_category`` unchanged (``live_parallel_multiple`` included): the checker picks its
  simple, multiple or parallel rule by whether the name contains ``parallel`` or ``multiple``.

The row supplies the rest (``posttrain prepare bfcl`` writes it): ``ground_truth`` is the JSON text of
BFCL's possible answer (``[{func: {param: [acceptable values]}}]``, ``""`` among the values meaning the
parameter may be left out; ``"[]"`` for irrelevance rows), ``extra_info["category"]`` and
``extra_info["bfcl_functions"]`` (JSON text of BFCL's function docs, with BFCL's own types, which the
checker reads).

:func:`check_calls` gives BFCL's whole verdict (its ``error_type`` for per-error-kind analysis);
:func:`compute_score` is the score function (the training rewards of posttrain's own beside it are
:mod:`posttrain.rewards.bfcl_credits`'s); :func:`answer_calls` writes a possible answer as calls
(the first acceptable value of each parameter), as the SFT transcripts and the tests do.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import re
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import InputError, import_optional
from posttrain.install import OUTSIDE, install_line

DATA_SOURCE = "bfcl"  # the rows posttrain prepare bfcl writes
MODEL_NAME = "posttrain"  # the checker's model_name; no "_" (the checker reads "_" in it as "/")
BFCL_PIN = OUTSIDE["bfcl-eval"].requirement
INSTALL_HINT = f"`{install_line('bfcl-eval')}` (`posttrain setup` does this; its pinned dependencies clash with posttrain's)"
_MODEL_CONFIG_MODULE = "bfcl_eval.constants.model_config"


@dataclass(frozen=True)
class CheckerModelConfig:
    """The one field of BFCL's ``ModelConfig`` that its AST checker reads."""

    underscore_to_dot: bool = False


@dataclass(frozen=True)
class Verdict:
    """BFCL's judgement of one answer: ``valid``, its ``error_type`` (``""`` when valid; e.g.
    ``simple_function_checker:wrong_func_name``, ``value_error:string``,
    ``simple_function_checker:missing_required``, ``multiple_function_checker:wrong_count``,
    ``irrelevance_error:decoder_success``) and, for the parallel checker, the error types of its
    attempted matches (``sub_error_types``), which name the kind its ``cannot_find_match`` hides."""

    valid: bool
    error_type: str = ""
    sub_error_types: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def bfcl_module(name: str) -> types.ModuleType:
    """Module ``name`` of bfcl-eval (MissingLibraryError, saying how to install it, when bfcl-eval is absent)."""
    return import_optional(name, package="bfcl-eval", needed_by="data_source 'bfcl' is judged by BFCL's own checker", hint=INSTALL_HINT)


@functools.cache
def ast_checker() -> Callable[..., dict[str, Any]]:
    """BFCL's ``ast_checker``, imported as the module docstring says (MissingLibraryError if bfcl-eval is absent)."""
    bfcl_module("bfcl_eval")
    try:
        model_config = importlib.import_module(_MODEL_CONFIG_MODULE)
    except ImportError:  # bfcl-eval installed without its dependencies: a stand-in with the one entry read
        model_config = types.ModuleType(_MODEL_CONFIG_MODULE, "posttrain's stand-in: the checker reads underscore_to_dot only")
        model_config.MODEL_CONFIG_MAPPING = {}
        sys.modules[_MODEL_CONFIG_MODULE] = model_config
    model_config.MODEL_CONFIG_MAPPING.setdefault(MODEL_NAME, CheckerModelConfig(underscore_to_dot=False))
    return bfcl_module("bfcl_eval.eval_checker.ast_eval.ast_checker").ast_checker


def data_dir() -> Path:
    """The installed bfcl-eval's data folder: ``BFCL_v4_<category>.json`` and ``possible_answer/``."""
    return Path(bfcl_module("bfcl_eval").__file__).parent / "data"


def installed_version() -> str:
    return importlib.metadata.version("bfcl-eval")


def is_no_call_category(category: str) -> bool:
    """Whether ``category`` has no possible answer: (ir)relevance, judged by whether a call was made."""
    return "relevance" in category


def model_output(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls ``[{"name", "arguments"}]`` as BFCL's decoded model output ``[{name: arguments}]``."""
    return [{call["name"]: call["arguments"]} for call in calls]


def check_calls(calls: Sequence[dict[str, Any]], ground_truth: str | list, extra_info: dict[str, Any]) -> Verdict:
    """BFCL's verdict on ``calls`` for one row (module docstring); InputError for a row that lacks
    what the checker needs."""
    category = row_field(extra_info, "category")
    output = model_output(calls)
    utils = bfcl_module("bfcl_eval.utils")
    if is_no_call_category(category):
        made_call = not utils.is_empty_output(output)
        if made_call == ("irrelevance" not in category):
            return Verdict(True)
        kind = "irrelevance_error:decoder_success" if made_call else "relevance_error:decoder_failed"
        return Verdict(False, kind)
    if not utils.is_function_calling_format_output(output):
        return Verdict(False, "ast_decoder:decoder_wrong_output_format")
    functions = json_value(row_field(extra_info, "bfcl_functions"), "extra_info.bfcl_functions")
    possible_answer = json_value(ground_truth, "reward_model.ground_truth")
    language = bfcl_module("bfcl_eval.constants.enums").Language.PYTHON
    result = ast_checker()(functions, output, possible_answer, language, category, MODEL_NAME)
    if result["valid"]:
        return Verdict(True)
    details = [e for e in result.get("error", []) if isinstance(e, dict)]
    sub_types = tuple(sub["sub_error_type"] for detail in details for sub in detail.values())
    return Verdict(False, result.get("error_type", "unknown"), sub_types, tuple(str(e) for e in result.get("error", [])))


def compute_score(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """``{"score", "acc", "num_calls"}``: 1.0 when BFCL's checker accepts ``calls``, else 0.0.

    ``calls`` come from the tool environment (``env.name=tools``, ``answer: calls``), which parsed the
    turn ``solution_str`` with the run's tool parser; this function never parses text itself.
    """
    calls = given_calls(calls)
    right = float(check_calls(calls, ground_truth, extra_info or {}).valid)
    return {"score": right, "acc": right, "num_calls": float(len(calls))}


def given_calls(calls: Sequence[dict[str, Any]] | None) -> Sequence[dict[str, Any]]:
    """The calls the tool environment parsed; InputError, saying how to score BFCL rows, when none were given."""
    if calls is None:
        raise InputError(
            "data_source 'bfcl' is scored from the calls of the model's first turn, and none were given: score BFCL rows "
            "with the tool environment (env.name=tools with answer: calls), which parses the calls and passes them")
    return calls


def answer_calls(ground_truth: str | list, bfcl_functions: str | list) -> list[dict[str, Any]]:
    """BFCL's possible answer as calls ``[{"name", "arguments"}]``: each parameter with its first
    acceptable value that is not ``""``, or left out when ``""`` (optional) comes first.

    Two BFCL rows need more than that, so a parameter is also left out when its function's doc does not
    define it and ``""`` is among its values, and is given its first non-``""`` value when ``""`` comes
    first but the doc requires it, and given ``""`` when that is its only acceptable value and the doc
    requires it (BFCL's checker accepts it: live_multiple_507-149-4's ``origin_airport``). Where the checker reads a value as a dict of acceptable values (a
    ``dict`` parameter's answer, its ``dict_checker``; each dict of an array of ``dict`` items, its
    ``list_dict_checker``) its keys are chosen the same way; any other value (a nested dict included)
    is used as it is. A few BFCL answers no call can match (a required parameter with no acceptable
    value): those calls are refused by :func:`check_calls` like any other."""
    answer = json_value(ground_truth, "reward_model.ground_truth")
    docs = {doc["name"]: doc["parameters"] for doc in json_value(bfcl_functions, "extra_info.bfcl_functions")}
    return [{"name": name, "arguments": _first_values(params, docs.get(name))} for call in answer for name, params in call.items()]


def _first_values(params: dict[str, list], schema: dict[str, Any] | None) -> dict[str, Any]:
    properties, required = (schema or {}).get("properties", {}), (schema or {}).get("required", [])
    arguments = {}
    for key, values in params.items():
        chosen = [value for value in values if value != ""]
        left_out = (values[:1] == [""] and key not in required) or (schema is not None and key not in properties and "" in values)
        if chosen and not left_out:
            arguments[key] = _as_checked(chosen[0], properties.get(key, {}))
        elif values == [""] and key in required:  # a required parameter whose one acceptable value is the empty string
            arguments[key] = ""
    return arguments


def _as_checked(value: Any, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "dict" and isinstance(value, dict):
        return _first_values(value, None)
    if schema.get("type") in ("array", "tuple") and schema.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_first_values(item, None) if isinstance(item, dict) else item for item in value]
    return value


# words too common in BFCL's function docs to tell two functions' subjects apart
_COMMON_WORDS = frozenset("""about based default specified given information optional parameters provided required retrieve
returns string number value values which their there these using within format should other function""".split())


def name_words(name: str) -> set[str]:
    """A function name's words, split at ``.``, ``_``, ``-`` and lower-to-upper case, lower-case."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[\s._\-]+", spaced) if w}


def question_words(text: str) -> set[str]:
    """A question's longer words (five letters or more), lower-case: what it is about, to set beside
    :func:`subject_words`."""
    return {w.lower() for w in re.findall(r"[A-Za-z]{5,}", text)}


def subject_words(functions: list[dict[str, Any]]) -> set[str]:
    """The words that say what the functions are about: their names' words and their descriptions' words of five
    letters or more, lower-case, common ones left out."""
    words = set()
    for doc in functions:
        words |= name_words(doc["name"]) | question_words(str(doc.get("description", "")))
    return words - _COMMON_WORDS


def shared_subject_words(messages: Sequence[dict[str, Any]], functions: list[dict[str, Any]]) -> set[str]:
    """The subject words (:func:`subject_words`) a question's user turns share with its functions: none for a
    question about something else, some for a near miss."""
    text = " ".join(m["content"] for m in messages if m["role"] == "user" and isinstance(m.get("content"), str))
    return question_words(text) & subject_words(functions)


def row_field(extra_info: dict[str, Any], key: str) -> Any:
    """``extra_info[key]``; InputError naming the field and how to write the rows when it is missing or empty."""
    if not extra_info or extra_info.get(key) in (None, ""):
        raise InputError(f"a bfcl row lacks extra_info.{key}, which BFCL's checker needs; write the rows with `posttrain prepare bfcl --out DIR`")
    return extra_info[key]


def json_value(value: Any, field: str) -> Any:
    """``value`` read as JSON when it is text (the rows keep BFCL's answers and docs as JSON text), else as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as error:
        raise InputError(f"a bfcl row's {field} is not JSON ({str(error)[:200]}); write the rows with `posttrain prepare bfcl --out DIR`") from None


__all__ = ["BFCL_PIN", "INSTALL_HINT", "MODEL_NAME", "CheckerModelConfig", "Verdict", "answer_calls", "ast_checker", "bfcl_module",
           "check_calls", "compute_score", "data_dir", "given_calls", "installed_version",
           "is_no_call_category", "json_value", "model_output", "row_field"]
