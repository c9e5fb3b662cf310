"""BFCL training rewards of posttrain's own, beside BFCL's verdict (:mod:`posttrain.rewards.bfcl`): rubric rules.

BFCL's checker says right or wrong for a whole answer; a small policy is rarely right on a row of several calls
or a function with many parameters, so its groups score alike and teach nothing. These rules give part credit, or
credit for one thing the answer does, that a rubric sets beside ``rule: bfcl`` at a smaller weight (docs/rewards.md);
each but :func:`decline_credit` is 1.0 where BFCL's checker accepts the whole answer, none has an ``acc`` (the run's
accuracy stays BFCL's verdict), and each judges a call only through BFCL's own checker
(:func:`~posttrain.rewards.bfcl.check_calls`) or by counting and naming, never by a re-implemented rule:

- :func:`argument_credit` (``bfcl_arguments``): a one-call answer's parameters, judged one by one by the checker;
- :func:`parameter_credit` (``bfcl_parameters``): the needed parameters a one-call answer names (ToolRL's match);
- :func:`calls_parameter_credit` and :func:`calls_argument_credit` (``bfcl_parameters_per_call``,
  ``bfcl_arguments_per_call``): the two above for each call of a row of one call or several;
- :func:`calls_count_credit` (``bfcl_calls_count``): writing as many calls as the row asks for;
- :func:`no_extra_calls_credit` (``bfcl_no_extra_calls``): nothing for writing more calls than it asks for;
- :func:`decline_credit` (``bfcl_decline``): making no call.

Each takes what ``compute_score`` takes (the calls the tool environment parsed, the row's ground truth and
``extra_info``) and returns ``{"score": float}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from posttrain.rewards.bfcl import answer_calls, check_calls, given_calls, is_no_call_category, json_value, row_field


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
    one = _one_refused_call(given_calls(calls), ground_truth, info)
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
    one = _one_refused_call(given_calls(calls), ground_truth, extra_info or {})
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
    given_calls(calls)  # no calls given: say how to score BFCL rows before reading the row
    docs = {doc["name"]: doc for doc in json_value(row_field(extra_info or {}, "bfcl_functions"), "extra_info.bfcl_functions")}

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
    wanted = sum(len(call) for call in json_value(ground_truth, "reward_model.ground_truth"))
    return {"score": min(wanted, len(given)) / max(wanted, len(given))}


def no_extra_calls_credit(solution_str: str, ground_truth: str | list, extra_info: dict[str, Any] | None = None,
                          calls: Sequence[dict[str, Any]] | None = None, **_: Any) -> dict[str, float]:
    """A training reward of its own, not BFCL's (the rubric rule ``bfcl_no_extra_calls``): on a row that needs a call,
    0.0 for an answer with more calls than the possible answer has, else 1.0 (no call included); 1.0 on a no-call row,
    every answer alike. Why: beside ``bfcl_parameters_per_call`` a call too many on a one-call row earns its other
    call's names and ranks above no call, so RL held it back little (docs/bfcl_runs.md, "Sampled at temperature 1.0");
    this ranks it below. Its ``score`` has no ``acc``."""
    given = given_calls(calls)
    if is_no_call_category(row_field(extra_info or {}, "category")):
        return {"score": 1.0}
    return {"score": float(len(given) <= sum(len(call) for call in json_value(ground_truth, "reward_model.ground_truth")))}


def _per_call_credit(calls: Sequence[dict[str, Any]] | None, ground_truth: str | list, extra_info: dict[str, Any] | None,
                     share: Callable[[str, dict[str, list], dict[str, Any]], float]) -> dict[str, float]:
    """The per-call rules' score: 1.0 where BFCL's checker accepts the calls; 0.0 on a no-call row or for no
    call; else each call of the possible answer, in its order, takes the written call of its function (arguments
    an object, not yet taken) on which ``share(name, acceptable values, arguments)`` is highest (the first of
    equals) and earns that share, one with none earns 0; the sum over the larger of the calls wanted and written."""
    given = _refused_calls(calls, ground_truth, extra_info or {})
    if isinstance(given, float):
        return {"score": given}
    wanted = [(name, possible) for call in json_value(ground_truth, "reward_model.ground_truth") for name, possible in call.items()]
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
    given = given_calls(calls)
    if check_calls(given, ground_truth, info).valid:
        return 1.0
    if is_no_call_category(row_field(info, "category")) or not given:
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
    reference = answer_calls(ground_truth, row_field(info, "bfcl_functions"))
    if len(reference) != 1 or len(calls) != 1 or calls[0]["name"] != reference[0]["name"] or not isinstance(calls[0]["arguments"], dict):
        return 0.0
    return reference[0], calls[0]["arguments"], json_value(ground_truth, "reward_model.ground_truth")[0][reference[0]["name"]]


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
    return {"score": float(not given_calls(calls))}


__all__ = ["argument_credit", "calls_argument_credit", "calls_count_credit", "calls_parameter_credit", "decline_credit",
           "no_extra_calls_credit", "parameter_credit"]
