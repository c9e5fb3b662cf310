"""data_source ``bfcl``: BFCL's own AST checker, reached through posttrain's scorer, accepts every
category's possible answers written as a model's calls and refuses altered ones."""

import json
import sys

import pytest
from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.data.preparers.bfcl import Question, load_category  # noqa: E402
from posttrain.errors import InputError, MissingLibraryError  # noqa: E402
from posttrain.rewards import DEFAULT_SCORE_FUNCTIONS, bfcl, bfcl_credits  # noqa: E402

ANSWER_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
                     "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
# BFCL possible answers that no call satisfies: a required parameter with no acceptable value
# (live_simple_106, _112: []), one the answer needs but the function does not define (live_multiple_862),
# one the function requires but the answer lacks (live_multiple_964). (live_multiple_507-149-4's required
# origin_airport accepts only "", and the call that gives it "" passes.)
UNANSWERABLE = {"live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_862-181-3", "live_multiple_964-207-0"}


def _row(question: Question) -> tuple[str, dict]:
    """The ground truth and extra_info that `posttrain prepare bfcl` writes for ``question``."""
    return json.dumps(question.ground_truth), {"category": question.category, "bfcl_functions": json.dumps(question.functions)}


def _score(question: Question, calls: list[dict]) -> float:
    ground_truth, extra_info = _row(question)
    return DEFAULT_SCORE_FUNCTIONS["bfcl"](solution_str="(the turn's text)", ground_truth=ground_truth, extra_info=extra_info, calls=calls)["score"]


@pytest.mark.parametrize("category", ANSWER_CATEGORIES)
def test_every_possible_answer_written_as_calls_is_accepted(category):
    questions = load_category(category)
    refused = {q.id for q in questions if _score(q, bfcl.answer_calls(q.ground_truth, q.functions)) != 1.0}
    assert refused == {i for i in UNANSWERABLE if i.startswith(category + "_")}
    assert len(questions) - len(refused) >= min(30, len(questions))  # live_parallel has 16 rows, live_parallel_multiple 24


def _alterations(question: Question) -> dict[str, list[dict]]:
    """The answer's calls altered four ways (a kind is absent when the row has nothing to alter)."""
    calls = bfcl.answer_calls(question.ground_truth, question.functions)
    docs = {doc["name"]: doc["parameters"] for doc in question.functions}
    first, args = calls[0], calls[0]["arguments"]
    altered = {"extra call": [*calls, calls[0]], "wrong function": [{**first, "name": first["name"] + "_x"}, *calls[1:]]}
    acceptable = question.ground_truth[0][first["name"]]
    for key, value in args.items():
        wrong = not value if isinstance(value, bool) else value + 7919 if isinstance(value, (int, float)) else value + " Zanzibar" if isinstance(value, str) else None
        if wrong is not None and wrong not in acceptable[key]:
            altered["wrong value"] = [{**first, "arguments": {**args, key: wrong}}, *calls[1:]]
            break
    required = [key for key in docs[first["name"]]["required"] if key in args]
    if required:
        altered["missing required parameter"] = [{**first, "arguments": {k: v for k, v in args.items() if k != required[0]}}, *calls[1:]]
    return altered


@pytest.mark.parametrize("category", ANSWER_CATEGORIES)
def test_altered_answers_are_refused(category):
    questions = [q for q in load_category(category, limit=40) if q.id not in UNANSWERABLE]
    tried = {"extra call": 0, "wrong function": 0, "wrong value": 0, "missing required parameter": 0}
    for question in questions:
        for kind, calls in _alterations(question).items():
            assert _score(question, calls) == 0.0, (question.id, kind, calls)
            tried[kind] += 1
    assert min(tried.values()) >= 10, tried


def test_the_verdict_names_the_error_kind():
    simple = load_category("simple_python", limit=1)[0]  # calculate_triangle_area(base=10, height=5, unit="units")
    ground_truth, extra_info = _row(simple)
    right = bfcl.answer_calls(ground_truth, simple.functions)
    assert right == [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units"}}]
    assert bfcl.check_calls(right, ground_truth, extra_info) == bfcl.Verdict(True)
    kinds = {
        "value_error:others": [{"name": "calculate_triangle_area", "arguments": {"base": 11, "height": 5}}],
        "simple_function_checker:missing_required": [{"name": "calculate_triangle_area", "arguments": {"base": 10}}],
        "simple_function_checker:wrong_func_name": [{"name": "area", "arguments": {"base": 10, "height": 5}}],
        "simple_function_checker:wrong_count": [*right, *right],
        "type_error:simple": [{"name": "calculate_triangle_area", "arguments": {"base": "10", "height": 5}}],
        "ast_decoder:decoder_wrong_output_format": [{"name": "calculate_triangle_area", "arguments": "base=10"}],
    }
    for kind, calls in kinds.items():
        assert bfcl.check_calls(calls, ground_truth, extra_info).error_type == kind
    parallel = load_category("parallel", limit=1)[0]
    calls = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    calls[0] = {**calls[0], "arguments": {k: v + 1 if isinstance(v, int) else v for k, v in calls[0]["arguments"].items()}}
    verdict = bfcl.check_calls(calls, *_row(parallel))
    assert verdict.error_type == "parallel_function_checker_no_order:cannot_find_match"
    assert "value_error:others" in verdict.sub_error_types


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance"])
def test_irrelevance_rows_are_right_without_a_call_only(category):
    for question in load_category(category, limit=30):
        assert question.ground_truth == []
        assert _score(question, []) == 1.0
        call = {"name": question.functions[0]["name"], "arguments": {}}
        assert _score(question, [call]) == 0.0
        assert bfcl.check_calls([call], *_row(question)).error_type == "irrelevance_error:decoder_success"


def test_relevance_rows_are_right_with_a_call():
    question = load_category("live_relevance", limit=1)[0]
    assert _score(question, []) == 0.0
    assert _score(question, [{"name": question.functions[0]["name"], "arguments": {}}]) == 1.0


def test_dotted_names_are_judged_as_written_through_the_stand_in_config():
    question = load_category("simple_python", limit=2)[1]  # math.factorial(number=5)
    assert _score(question, [{"name": "math.factorial", "arguments": {"number": 5}}]) == 1.0
    assert _score(question, [{"name": "math_factorial", "arguments": {"number": 5}}]) == 0.0
    config = sys.modules["bfcl_eval.constants.model_config"].MODEL_CONFIG_MAPPING[bfcl.MODEL_NAME]
    assert config.underscore_to_dot is False


def test_score_dict_and_refusals():
    question = load_category("parallel", limit=1)[0]
    calls = bfcl.answer_calls(question.ground_truth, question.functions)
    ground_truth, extra_info = _row(question)
    assert bfcl.compute_score("", ground_truth, extra_info, calls=calls) == {"score": 1.0, "acc": 1.0, "num_calls": float(len(calls))}
    with pytest.raises(InputError, match="env.name=tools"):
        bfcl.compute_score("<tool_call>...</tool_call>", ground_truth, extra_info)
    with pytest.raises(InputError, match="extra_info.bfcl_functions.*posttrain prepare bfcl"):
        bfcl.compute_score("", ground_truth, {"category": "parallel"}, calls=calls)


def test_argument_credit_is_the_share_of_parameters_the_checker_accepts_one_by_one():
    simple = load_category("simple_python", limit=1)[0]  # calculate_triangle_area(base=10, height=5, unit="units" or left out)
    ground_truth, extra_info = _row(simple)

    def credit(arguments: dict, name: str = "calculate_triangle_area", row: tuple = (ground_truth, extra_info)) -> float:
        return bfcl_credits.argument_credit("", *row, calls=[{"name": name, "arguments": arguments}])["score"]

    assert credit({"base": 10, "height": 5}) == 1.0  # the checker accepts the whole answer
    assert credit({"base": 11, "height": 5}) == 1 / 2  # base wrong, height right; unit may be left out and was: not judged
    assert credit({"base": "10", "height": 5, "unit": "cm"}) == 1 / 3  # a string for an integer, and a unit BFCL does not accept
    assert credit({"base": 10, "height": 5, "unit": "units"}) == 1.0
    assert credit({"height": 6}) == 0.0  # base missing, height wrong
    assert credit({}) == 0.0  # writing nothing earns nothing
    assert credit({"base": 10, "height": 5, "colour": "red"}) == 2 / 3  # a parameter BFCL does not expect: refused, so below 1
    assert credit({"base": 10, "height": 5}, name="area") == 0.0  # a wrong function earns nothing
    assert bfcl_credits.argument_credit("", ground_truth, extra_info, calls=[])["score"] == 0.0  # neither does no call
    assert "acc" not in bfcl_credits.argument_credit("", ground_truth, extra_info, calls=[])  # accuracy stays the checker's (the rubric's rule)
    irrelevance = load_category("live_irrelevance", limit=1)[0]
    call = [{"name": irrelevance.functions[0]["name"], "arguments": {}}]
    assert bfcl_credits.argument_credit("", *_row(irrelevance), calls=call)["score"] == 0.0
    assert bfcl_credits.argument_credit("", *_row(irrelevance), calls=[])["score"] == 1.0
    parallel = load_category("parallel", limit=1)[0]  # several calls: the checker's verdict only
    calls = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert bfcl_credits.argument_credit("", *_row(parallel), calls=calls)["score"] == 1.0
    assert bfcl_credits.argument_credit("", *_row(parallel), calls=calls[:1])["score"] == 0.0
    with pytest.raises(InputError, match="env.name=tools"):
        bfcl_credits.argument_credit("<tool_call>...</tool_call>", ground_truth, extra_info)


def test_parameter_credit_pays_naming_the_needed_parameters_whatever_their_values():
    """calculate_triangle_area(base=10, height=5, unit="units" or left out): a call that leaves a needed
    parameter out earns less than one that gives it a wrong value; the optional one is not counted either way;
    a name the possible answer lacks counts against; a right answer 1.0, every other answer as argument_credit."""
    simple = load_category("simple_python", limit=1)[0]
    ground_truth, extra_info = _row(simple)

    def credit(arguments: dict, name: str = "calculate_triangle_area") -> float:
        return bfcl_credits.parameter_credit("", ground_truth, extra_info, calls=[{"name": name, "arguments": arguments}])["score"]

    assert credit({"base": 11, "height": 6}) == 1.0 > credit({"base": 11}) == 1 / 2  # both named, values wrong; one left out
    assert credit({"base": 10, "height": 5}) == 1.0 and credit({}) == 0.0
    assert credit({"base": 11, "height": 6, "unit": "cm"}) == credit({"base": 11, "height": 6})  # the optional one: not counted
    assert credit({"base": 11, "height": 6, "colour": "red"}) == 2 / 3  # a name the possible answer does not have
    assert credit({"base": 11, "height": 6}, name="area") == 0.0  # a wrong function earns nothing
    assert bfcl_credits.parameter_credit("", ground_truth, extra_info, calls=[]) == {"score": 0.0}  # nor does no call; no acc
    irrelevance = load_category("live_irrelevance", limit=1)[0]
    assert bfcl_credits.parameter_credit("", *_row(irrelevance), calls=[{"name": irrelevance.functions[0]["name"], "arguments": {}}])["score"] == 0.0
    parallel = load_category("parallel", limit=1)[0]
    calls = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert bfcl_credits.parameter_credit("", *_row(parallel), calls=calls[:1])["score"] == 0.0  # several calls: the checker's verdict only
    assert bfcl_credits.parameter_credit("", *_row(parallel), calls=calls)["score"] == 1.0
    nothing_needed = json.dumps([{"calculate_triangle_area": {"base": ["", 10], "height": ["", 5]}}])
    assert bfcl_credits.parameter_credit("", nothing_needed, extra_info, calls=[{"name": "calculate_triangle_area", "arguments": {"base": 3}}]) == {
        "score": 1.0}  # refused for a wrong value, but nothing needed is left out and no name is unexpected
    from posttrain.rewards.registry import RULES
    assert RULES["bfcl_parameters"] is bfcl_credits.parameter_credit


def test_parameter_credit_per_call_ranks_two_calls_with_the_right_names_above_stopping_after_the_first():
    """A parallel row (two calls of one function): each possible call matched to a written call of its function
    earns its parameter-name share; the sum is over the larger of the calls wanted and written. On one-call
    rows it agrees with bfcl_parameters for one call, and a call too many costs a share there too."""
    parallel = load_category("parallel", limit=1)[0]
    calls = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert len(calls) == 2 and calls[0]["name"] == calls[1]["name"]

    def credit(question, written: list[dict]) -> float:
        return bfcl_credits.calls_parameter_credit("", *_row(question), calls=written)["score"]

    wrong_values = [{"name": call["name"], "arguments": {key: "?" for key in call["arguments"]}} for call in calls]
    assert not bfcl.check_calls(wrong_values, *_row(parallel)).valid  # refused: the credit is for the names alone
    assert credit(parallel, calls) == 1.0 and credit(parallel, wrong_values) == 1.0 > credit(parallel, wrong_values[:1]) == 0.5
    assert credit(parallel, [calls[0], {"name": "elsewhere", "arguments": calls[1]["arguments"]}]) == 0.5  # a wrong function: 0
    assert credit(parallel, wrong_values + wrong_values[:1]) == 2 / 3  # a third call, of the same function: a share lost
    assert credit(parallel, []) == 0.0
    simple = load_category("simple_python", limit=1)[0]
    for arguments in ({"base": 11, "height": 6}, {"base": 11}, {"base": 11, "height": 6, "colour": "red"}, {}):
        one = [{"name": "calculate_triangle_area", "arguments": arguments}]
        assert credit(simple, one) == bfcl_credits.parameter_credit("", *_row(simple), calls=one)["score"]
    two = [{"name": "calculate_triangle_area", "arguments": {"base": 11, "height": 6}}, {"name": "area", "arguments": {}}]
    assert credit(simple, two) == 0.5 and bfcl_credits.parameter_credit("", *_row(simple), calls=two)["score"] == 0.0
    irrelevance = load_category("live_irrelevance", limit=1)[0]
    assert credit(irrelevance, [{"name": irrelevance.functions[0]["name"], "arguments": {}}]) == 0.0
    assert credit(irrelevance, []) == 1.0  # no call where none is right: the checker's verdict
    from posttrain.rewards.registry import RULES
    assert RULES["bfcl_parameters_per_call"] is bfcl_credits.calls_parameter_credit


def _check_irrelevance_calls_and_registry(rule, name: str, row) -> None:
    """What every per-call rule shares: on an irrelevance row a call earns 0 and no call the checker's 1.0; no
    calls given is an InputError that says how to score BFCL rows; the rubric finds the rule by ``name``."""
    irrelevance = load_category("live_irrelevance", limit=1)[0]
    assert rule("", *_row(irrelevance), calls=[{"name": irrelevance.functions[0]["name"], "arguments": {}}])["score"] == 0.0
    assert rule("", *_row(irrelevance), calls=[])["score"] == 1.0  # no call where none is right: the checker's verdict
    with pytest.raises(InputError, match="env.name=tools"):
        rule("<tool_call>...</tool_call>", *_row(row))
    from posttrain.rewards.registry import RULES
    assert RULES[name] is rule


def test_argument_credit_per_call_pays_each_calls_values_the_checker_accepts_not_their_names():
    """A parallel row (spotify.play twice: Taylor Swift 20, Maroon 5 15): each possible call takes the written call
    of its function whose values the checker accepts most, in whatever order they were written, and earns that
    share; the names alone earn nothing. On one-call rows it agrees with bfcl_arguments."""
    parallel = load_category("parallel", limit=1)[0]
    calls = bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    assert [call["arguments"] for call in calls] == [{"artist": "Taylor Swift", "duration": 20}, {"artist": "Maroon 5", "duration": 15}]

    def credit(question, written: list[dict]) -> float:
        return bfcl_credits.calls_argument_credit("", *_row(question), calls=written)["score"]

    def play(artist, duration) -> dict:
        return {"name": "spotify.play", "arguments": {"artist": artist, "duration": duration}}

    wrong_values = [play("?", "?"), play("?", "?")]
    assert credit(parallel, calls) == 1.0 and credit(parallel, calls[::-1]) == 1.0
    assert credit(parallel, wrong_values) == 0.0 < bfcl_credits.calls_parameter_credit("", *_row(parallel), calls=wrong_values)["score"] == 1.0
    assert credit(parallel, calls[:1]) == 0.5  # stopping after the first call: half
    assert credit(parallel, [play("Maroon 5", 16), play("Taylor Swift", 20)]) == pytest.approx((1 + 1 / 2) / 2)  # matched across order
    assert credit(parallel, [play("Taylor Swift", 15), play("Maroon 5", 20)]) == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert credit(parallel, [*calls, play("Adele", 3)]) == pytest.approx(2 / 3)  # a call too many: a share lost
    assert credit(parallel, [calls[0], {"name": "elsewhere", "arguments": calls[1]["arguments"]}]) == 0.5  # a wrong function: 0
    assert credit(parallel, []) == 0.0 and "acc" not in bfcl_credits.calls_argument_credit("", *_row(parallel), calls=[])
    both = load_category("parallel_multiple", limit=1)[0]  # sum_of_multiples(1, 1000, [3, 5]) and product_of_primes(5)
    right = bfcl.answer_calls(both.ground_truth, both.functions)
    assert credit(both, [right[1], {**right[0], "arguments": {**right[0]["arguments"], "upper_limit": 999}}]) == pytest.approx((2 / 3 + 1) / 2)
    for question in (load_category("simple_python", limit=1)[0], load_category("multiple", limit=1)[0]):
        name = bfcl.answer_calls(question.ground_truth, question.functions)[0]["name"]
        for arguments in ({"base": 10, "height": 6}, {"side1": 5, "side2": 3, "get_area": True}, {"side1": 5, "colour": "red"}, {}):
            one = [{"name": name, "arguments": arguments}]
            assert credit(question, one) == bfcl_credits.argument_credit("", *_row(question), calls=one)["score"]
    _check_irrelevance_calls_and_registry(bfcl_credits.calls_argument_credit, "bfcl_arguments_per_call", parallel)


def test_calls_count_credit_pays_as_many_calls_as_the_row_asks_whatever_they_say():
    """A parallel row of two calls: two calls with wrong values earn all of it, one call half, three calls two
    thirds; a one-call row pays one call to any function; no call, and a call on an irrelevance row, earn 0."""
    parallel = load_category("parallel", limit=1)[0]
    right = bfcl.answer_calls(parallel.ground_truth, parallel.functions)

    def credit(question, written: list[dict]) -> float:
        return bfcl_credits.calls_count_credit("", *_row(question), calls=written)["score"]

    wrong = {"name": "spotify.play", "arguments": {"artist": "?", "duration": "?"}}
    assert credit(parallel, right) == 1.0 and credit(parallel, [wrong, wrong]) == 1.0
    assert credit(parallel, [wrong]) == 0.5 and credit(parallel, right[:1]) == 0.5
    assert credit(parallel, [*right, wrong]) == pytest.approx(2 / 3) and credit(parallel, [wrong] * 4) == 0.5
    assert credit(parallel, [{"name": "elsewhere", "arguments": "not an object"}] * 2) == 1.0  # whatever the calls say
    simple = load_category("simple_python", limit=1)[0]
    assert credit(simple, [{"name": "elsewhere", "arguments": {}}]) == 1.0 and credit(simple, [wrong, wrong]) == 0.5
    assert credit(simple, []) == 0.0 and "acc" not in bfcl_credits.calls_count_credit("", *_row(simple), calls=[])
    _check_irrelevance_calls_and_registry(bfcl_credits.calls_count_credit, "bfcl_calls_count", parallel)


def test_no_extra_calls_credit_takes_all_from_an_answer_with_a_call_too_many_and_ranks_it_below_no_call():
    """On a one-call row a call too many earns 0 (right or not, any function), one call or none 1; on a two-call row
    three calls 0, one or two 1; a no-call row 1 whatever the answer. Beside the checker and the names credit, on a
    one-call row: the right call above no call above the right call written twice."""
    from posttrain.rewards.registry import RULES
    from posttrain.rewards.rubric import build_rubric

    simple, parallel = load_category("simple_python", limit=1)[0], load_category("parallel", limit=1)[0]
    irrelevance = load_category("live_irrelevance", limit=1)[0]
    one, two = bfcl.answer_calls(simple.ground_truth, simple.functions), bfcl.answer_calls(parallel.ground_truth, parallel.functions)
    other = {"name": "elsewhere", "arguments": "not an object"}

    def credit(question, written: list[dict]) -> dict:
        return bfcl_credits.no_extra_calls_credit("", *_row(question), calls=written)

    assert [credit(simple, c)["score"] for c in ([], one, [other], one * 2, [*one, other])] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [credit(parallel, c)["score"] for c in ([], two[:1], two, [*two, two[0]])] == [1.0, 1.0, 1.0, 0.0]
    assert [credit(irrelevance, c)["score"] for c in ([], [other], [other] * 3)] == [1.0, 1.0, 1.0]
    swapped = _row(simple)[1] | {"category": "swapped_irrelevance"}  # a taught question asked with other functions
    assert bfcl_credits.no_extra_calls_credit("", "[]", swapped, calls=one)["score"] == 1.0
    assert "acc" not in credit(simple, one)
    with pytest.raises(InputError, match="env.name=tools"):
        bfcl_credits.no_extra_calls_credit("<tool_call>...</tool_call>", *_row(simple))
    assert RULES["bfcl_no_extra_calls"] is bfcl_credits.no_extra_calls_credit
    rubric = build_rubric([{"name": "checker", "weight": 1.0, "rule": "bfcl"},
                           {"name": "parameters", "weight": 0.5, "rule": "bfcl_parameters_per_call"},
                           {"name": "extra", "weight": 0.5, "rule": "bfcl_no_extra_calls"}])
    ground_truth, extra_info = _row(simple)
    right, none, twice = (rubric(solution_str="", ground_truth=ground_truth, extra_info=extra_info, calls=c)["score"] for c in (one, [], one * 2))
    assert right == 1.0 and none == pytest.approx(0.25) and twice == pytest.approx(0.125)


def test_a_rubric_of_the_checker_and_argument_credit_keeps_bfcls_verdict_as_the_accuracy():
    from posttrain.rewards.rubric import build_rubric

    rubric = build_rubric([{"name": "checker", "weight": 1.0, "rule": "bfcl"}, {"name": "arguments", "weight": 0.5, "rule": "bfcl_arguments"}])
    simple = load_category("simple_python", limit=1)[0]
    ground_truth, extra_info = _row(simple)
    half = rubric(solution_str="", ground_truth=ground_truth, extra_info=extra_info, calls=[{"name": "calculate_triangle_area", "arguments": {"base": 11, "height": 5}}])
    assert half["acc"] == 0.0 and half["score"] == pytest.approx(0.5 * (1 / 2) / 1.5)
    right = rubric(solution_str="", ground_truth=ground_truth, extra_info=extra_info, calls=bfcl.answer_calls(ground_truth, simple.functions))
    assert right["acc"] == 1.0 and right["score"] == 1.0


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # what an absent package looks like to import
    with pytest.raises(MissingLibraryError, match=r'`pip install --no-deps bfcl-eval==2026\.3\.23` \(`posttrain setup` does this'):
        bfcl.ast_checker.__wrapped__()
    with pytest.raises(MissingLibraryError, match="--no-deps"):
        bfcl.data_dir()


def test_decline_credit_ranks_declining_between_a_wrong_call_and_the_right_one_beside_the_checker():
    from posttrain.rewards.rubric import build_rubric

    rubric = build_rubric([{"name": "checker", "weight": 1.0, "rule": "bfcl"}, {"name": "decline", "weight": 0.25, "rule": "bfcl_decline"}])
    simple = load_category("simple_python", limit=1)[0]
    ground_truth, extra_info = _row(simple)
    right_calls = bfcl.answer_calls(ground_truth, simple.functions)
    wrong_calls = [{"name": right_calls[0]["name"], "arguments": {}}]

    def scored(calls, row=(ground_truth, extra_info)):
        return rubric(solution_str="", ground_truth=row[0], extra_info=row[1], calls=calls)

    assert bfcl_credits.decline_credit("", ground_truth, extra_info, calls=[]) == {"score": 1.0}  # no acc: BFCL's verdict keeps it
    assert bfcl_credits.decline_credit("", ground_truth, extra_info, calls=right_calls) == {"score": 0.0}
    right, declined, wrong = scored(right_calls), scored([]), scored(wrong_calls)
    assert (declined["rubric/decline"], wrong["rubric/decline"]) == (1.0, 0.0)
    assert (right["score"], right["acc"]) == (pytest.approx(1.0 / 1.25), 1.0)
    assert (declined["score"], declined["acc"]) == (pytest.approx(0.25 / 1.25), 0.0)  # the accuracy stays BFCL's verdict
    assert (wrong["score"], wrong["acc"]) == (0.0, 0.0)
    irrelevance = _row(load_category("irrelevance", limit=1)[0])
    assert scored([], irrelevance)["score"] == 1.0 and scored(wrong_calls, irrelevance)["score"] == 0.0
    with pytest.raises(InputError, match="env.name=tools"):
        bfcl_credits.decline_credit("<tool_call>...</tool_call>", ground_truth, extra_info)
