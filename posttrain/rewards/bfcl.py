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
:func:`compute_score` is the score function (:func:`argument_credit`, :func:`parameter_credit` and
:func:`decline_credit`, training rewards of their own, give part credit for a call's parameters, for naming
the parameters it needs, and credit for making no call; :func:`calls_parameter_credit` and
:func:`calls_argument_credit` give the first two for each call of a row of several, :func:`calls_count_credit`
for writing as many calls as the row asks for, :func:`no_extra_calls_credit` takes all from writing more);
:func:`answer_calls` writes a possible answer as calls (the first acceptable value of each parameter), as
the SFT transcripts and the tests do.
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
    category = _row_field(extra_info, "category")
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
    functions = _json_value(_row_field(extra_info, "bfcl_functions"), "extra_info.bfcl_functions")
    possible_answer = _json_value(ground_truth, "reward_model.ground_truth")
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
    calls = _given_calls(calls)
    right = float(check_calls(calls, ground_truth, extra_info or {}).valid)
    return {"score": right, "acc": right, "num_calls": float(len(calls))}


def argument_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_arguments``): for an answer of
    one call to the right function that BFCL's checker refuses, the share of its judged parameters the
    checker accepts one at a time; 1.0 only where the checker accepts the whole answer; 0.0 for every
    other answer (no call, a wrong function, a call on an irrelevance row, rows of several calls).

    Judged: each parameter the possible answer needs (``""`` not among its values) and each one the
    model wrote; a parameter the answer may leave out and the model left out earns nothing either way,
    so writing less is not paid. A parameter is judged by asking the checker about the possible
    answer's own call (:func:`answer_calls`) with that one parameter as the model wrote it (or left out,
    as it left it out), so the checker's rules for each type hold and nothing of them is written here;
    a parameter the possible answer does not name counts as wrong (the checker refuses it). Its
    ``score`` has no ``acc``: beside ``rule: bfcl`` in a rubric, the run's accuracy stays BFCL's verdict
    (rewards/rubric.py)."""
    info = extra_info or {}
    one = _one_refused_call(_given_calls(calls), ground_truth, info)
    if not isinstance(one, tuple):
        return {"score": one}
    reference, written, possible = one
    return {"score": _arguments_share(reference, written, possible, ground_truth, info)}


def _arguments_share(reference: dict[str, Any], written: dict[str, Any], possible: dict[str, list],
                     ground_truth: str | list, info: dict[str, Any]) -> float:
    """The share of a call's judged parameters BFCL's checker accepts one at a time (:func:`argument_credit`):
    ``reference`` is the possible answer's call, ``written`` the arguments the model wrote, ``possible`` the
    parameters' acceptable values, ``ground_truth`` and ``info`` the one-call row the checker is asked about."""
    # judged: the parameters the answer needs ("" not acceptable) and those the model wrote; one the answer
    # does not name is wrong (the checker refuses it), one it may leave out and did is not judged
    judged = [key for key in possible if "" not in possible[key] or key in written]
    unexpected = [key for key in written if key not in possible]
    right = 0
    for key in judged:
        trial = {k: v for k, v in reference["arguments"].items() if k != key} | ({key: written[key]} if key in written else {})
        right += check_calls([{"name": reference["name"], "arguments": trial}], ground_truth, info).valid
    total = len(judged) + len(unexpected)
    return right / total if total else 0.0


def parameter_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_parameters``; ToolRL's parameter-name
    match): for an answer of one call to the right function that BFCL's checker refuses, the parameters the
    possible answer needs (``""`` not among its values) that the call names, over those needed and those it
    names that the possible answer does not (1.0 when there are neither); whatever their values. 1.0 where the
    checker accepts the whole answer; 0.0 for every other answer, as :func:`argument_credit`.

    Under BFCL's verdict alone a needed parameter left out costs no more than one given a wrong value, and an
    optional one given a wrong value fails the answer where leaving it out would not: writing fewer parameters
    is never worse. Beside ``rule: bfcl`` this pays naming the needed ones, and leaves the optional ones (the
    possible answer names them, ``""`` among their values) to the checker. Its ``score`` has no ``acc``."""
    one = _one_refused_call(_given_calls(calls), ground_truth, extra_info or {})
    if not isinstance(one, tuple):
        return {"score": one}
    _, written, possible = one
    return {"score": _names_share(written, possible)}


def calls_parameter_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_parameters_per_call``): ``bfcl_parameters``
    on every row that needs a call, of one call or several. Each call of the possible answer is matched to a
    written call of the same function (:func:`_per_call_credit`: the one named best, the first of equals) and
    earns that call's parameter-name share (:func:`_names_share`); one with no match earns 0. The score is their
    sum over the larger of the possible answer's calls and the calls written, so that a call left out and a call
    too many both cost a share: on a row that asks for two calls, stopping after the first earns at most 1/2. 1.0 where BFCL's checker accepts
    the whole answer; 0.0 on a row where no call is right, or for no call. Its ``score`` has no ``acc``.

    Why: ``bfcl_parameters`` pays a row of several calls only when the checker accepts it, which a small policy
    rarely does, so those rows' groups score alike and teach nothing, while the one-call rows teach it to stop
    after its first call; this rule ranks two calls with the right names above one."""
    return _per_call_credit(calls, ground_truth, extra_info, lambda name, possible, written: _names_share(written, possible))


def calls_argument_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_arguments_per_call``): ``bfcl_arguments``
    for each call of a row of one call or several, matched as ``bfcl_parameters_per_call`` matches them. A call of
    the possible answer earns the share of its judged parameters BFCL's checker accepts one at a time, the checker
    asked about that call alone (the possible answer's one call, its function's doc, BFCL's simple rule); the
    score is their sum over the larger of the calls wanted and written. 1.0 where the checker accepts the whole
    answer; 0.0 on a row where no call is right, or for no call. Its ``score`` has no ``acc``.

    Why: ``bfcl_parameters_per_call`` pays a needed parameter's name whatever its value, and a policy that moves
    faster learns to write more parameters with wrong values (docs/measured/bfcl_two.txt: wrong value or type
    202 → 267); this rule pays a parameter only where the checker accepts its value."""
    _given_calls(calls)  # no calls given: say how to score BFCL rows before reading the row
    docs = {doc["name"]: doc for doc in _json_value(_row_field(extra_info or {}, "bfcl_functions"), "extra_info.bfcl_functions")}

    def share(name: str, possible: dict[str, list], written: dict[str, Any]) -> float:
        if name not in docs:
            return 0.0
        one_truth, one_info = [{name: possible}], {"category": "simple", "bfcl_functions": [docs[name]]}
        return _arguments_share(answer_calls(one_truth, [docs[name]])[0], written, possible, one_truth, one_info)

    return _per_call_credit(calls, ground_truth, extra_info, share)


def calls_count_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_calls_count``): on a row that needs a
    call, the smaller of the calls written and the calls the possible answer has over the larger, whatever the
    calls say (1 − |written − wanted| / the larger). 1.0 where BFCL's checker accepts the whole answer; 0.0 on a
    row where no call is right, or for no call. Its ``score`` has no ``acc``.

    Why: beside ``bfcl_arguments_per_call`` (which pays a second call only the share of its values the checker
    accepts), RL got the number of calls right less often on rows of two calls (docs/measured/bfcl_argcall.txt);
    this rule pays writing as many calls as the row asks for, apart from what they say."""
    given = _refused_calls(calls, ground_truth, extra_info or {})
    if isinstance(given, float):
        return {"score": given}
    wanted = sum(len(call) for call in _json_value(ground_truth, "reward_model.ground_truth"))
    return {"score": min(wanted, len(given)) / max(wanted, len(given))}


def no_extra_calls_credit(solution_str: str, ground_truth: str | list, extra_info: dict[str, Any] | None = None,
                          calls: Sequence[dict[str, Any]] | None = None, **_: Any) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_no_extra_calls``): on a row that needs a call,
    0.0 for an answer with more calls than the possible answer has, else 1.0 (no call included); 1.0 on a no-call row,
    every answer alike. Why: beside ``bfcl_parameters_per_call`` a call too many on a one-call row earns its other
    call's names and ranks above no call, so RL held it back little (docs/bfcl_runs.md, "Sampled at temperature 1.0");
    this ranks it below. Its ``score`` has no ``acc``."""
    given = _given_calls(calls)
    if is_no_call_category(_row_field(extra_info or {}, "category")):
        return {"score": 1.0}
    return {"score": float(len(given) <= sum(len(call) for call in _json_value(ground_truth, "reward_model.ground_truth")))}


def _per_call_credit(calls: Sequence[dict[str, Any]] | None, ground_truth: str | list, extra_info: dict[str, Any] | None,
                     share: Callable[[str, dict[str, list], dict[str, Any]], float]) -> dict[str, float]:
    """The per-call rules' score: 1.0 where BFCL's checker accepts the calls; 0.0 on a no-call row or for no
    call; else each call of the possible answer, in its order, takes the written call of its function (arguments
    an object, not yet taken) on which ``share(name, acceptable values, arguments)`` is highest (the first of
    equals) and earns that share, one with none earns 0; the sum over the larger of the calls wanted and written."""
    given = _refused_calls(calls, ground_truth, extra_info or {})
    if isinstance(given, float):
        return {"score": given}
    wanted = [(name, possible) for call in _json_value(ground_truth, "reward_model.ground_truth") for name, possible in call.items()]
    unmatched = [call for call in given if isinstance(call.get("arguments"), dict)]
    earned = 0.0
    for name, possible in wanted:
        shares = [(share(name, possible, call["arguments"]), i) for i, call in enumerate(unmatched) if call["name"] == name]
        if shares:
            best, i = max(shares, key=lambda pair: pair[0])
            unmatched.pop(i)
            earned += best
    return {"score": earned / max(len(wanted), len(given))}


def _refused_calls(calls: Sequence[dict[str, Any]] | None, ground_truth: str | list,
                   info: dict[str, Any]) -> float | Sequence[dict[str, Any]]:
    """For the per-call rules: 1.0 where BFCL's checker accepts ``calls``; 0.0 on a no-call row or for no
    call; else the calls, for the rule to judge."""
    given = _given_calls(calls)
    if check_calls(given, ground_truth, info).valid:
        return 1.0
    if is_no_call_category(_row_field(info, "category")) or not given:
        return 0.0
    return given


def _names_share(written: dict[str, Any], possible: dict[str, list]) -> float:
    """The parameters ``possible`` needs ("" not among its values) that ``written`` names, over those needed and
    the names written that ``possible`` lacks; 1.0 when there are neither (ToolRL's parameter-name match)."""
    needed = {key for key, values in possible.items() if "" not in values}
    unexpected = set(written) - set(possible)
    total = len(needed) + len(unexpected)
    return len(needed & set(written)) / total if total else 1.0


def _one_refused_call(calls: Sequence[dict[str, Any]], ground_truth: str | list,
                      info: dict[str, Any]) -> float | tuple[dict[str, Any], dict[str, Any], dict[str, list]]:
    """For the part-credit rules: 1.0 where BFCL's checker accepts ``calls``; 0.0 unless they are one call to
    the possible answer's one function, with arguments as an object; else (that answer as a call, the
    arguments written, the possible answer's parameters with their acceptable values)."""
    judged = _refused_calls(calls, ground_truth, info)
    if isinstance(judged, float):
        return judged
    reference = answer_calls(ground_truth, _row_field(info, "bfcl_functions"))
    if len(reference) != 1 or len(calls) != 1 or calls[0]["name"] != reference[0]["name"] or not isinstance(calls[0]["arguments"], dict):
        return 0.0
    return reference[0], calls[0]["arguments"], _json_value(ground_truth, "reward_model.ground_truth")[0][reference[0]["name"]]


def decline_credit(
    solution_str: str,
    ground_truth: str | list,
    extra_info: dict[str, Any] | None = None,
    calls: Sequence[dict[str, Any]] | None = None,
    **_: Any,
) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_decline``): 1.0 for an answer that
    makes no call, on any row, else 0.0. Beside ``rule: bfcl`` at a smaller weight it ranks, on a row that
    needs a call, declining above a wrong call (BFCL's checker refuses both) and below the right one: a
    policy unsure of the function learns to decline rather than call a near miss. On an irrelevance row (no
    call is right) it agrees with the checker; on a live_relevance row (any call is right) it disagrees: not
    for those. Its ``score`` has no ``acc``: the accuracy stays BFCL's verdict."""
    return {"score": float(not _given_calls(calls))}


def _given_calls(calls: Sequence[dict[str, Any]] | None) -> Sequence[dict[str, Any]]:
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
    answer = _json_value(ground_truth, "reward_model.ground_truth")
    docs = {doc["name"]: doc["parameters"] for doc in _json_value(bfcl_functions, "extra_info.bfcl_functions")}
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


def _row_field(extra_info: dict[str, Any], key: str) -> Any:
    if not extra_info or extra_info.get(key) in (None, ""):
        raise InputError(f"a bfcl row lacks extra_info.{key}, which BFCL's checker needs; write the rows with `posttrain prepare bfcl --out DIR`")
    return extra_info[key]


def _json_value(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as error:
        raise InputError(f"a bfcl row's {field} is not JSON ({str(error)[:200]}); write the rows with `posttrain prepare bfcl --out DIR`") from None


__all__ = ["BFCL_PIN", "INSTALL_HINT", "MODEL_NAME", "CheckerModelConfig", "Verdict", "answer_calls", "argument_credit", "ast_checker", "bfcl_module",
           "calls_argument_credit", "calls_count_credit", "calls_parameter_credit", "check_calls", "compute_score", "data_dir", "decline_credit", "installed_version",
           "is_no_call_category", "model_output", "no_extra_calls_credit", "parameter_credit"]
