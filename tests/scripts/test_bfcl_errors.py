"""scripts/bfcl_errors.py: each evaluation's mistakes by kind per category, judged by BFCL's own checker,
and the call rate on the rows that need a call, from episode files a person can read."""

import json
import subprocess
import sys
from pathlib import Path

from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.data.preparers.bfcl import load_category  # noqa: E402
from posttrain.recipes import load_recipe  # noqa: E402
from posttrain.recipes.table import recipe_table  # noqa: E402
from posttrain.rewards import bfcl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NO_CALL = "None of the functions I have can do this."


def episode(question, answer: str, index: int = 0) -> str:
    row = {"data_source": "bfcl", "messages": [{"role": "user", "content": f"(question {index})"}, {"role": "assistant", "content": answer}],
           "ground_truth": json.dumps(question.ground_truth), "success": None,
           "extra_info": {"index": index, "category": question.category, "bfcl_functions": json.dumps(question.functions)}}
    return json.dumps(row) + "\n"


def as_calls(calls: list[dict]) -> str:
    return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)


def two_evaluations(tmp_path) -> tuple[Path, Path]:
    """``calls``: 3 right calls and one missing on simple_python, no call on either irrelevance row;
    ``silent``: never a call where one is due, a call on one irrelevance row."""
    simple, irrelevance = load_category("simple_python")[:4], load_category("irrelevance")[:2]
    right = [as_calls(bfcl.answer_calls(q.ground_truth, q.functions)) for q in simple]
    stray = as_calls([{"name": irrelevance[0].functions[0]["name"], "arguments": {}}])
    questions = [*simple, *irrelevance]
    calls, silent = tmp_path / "calls" / "episodes.jsonl", tmp_path / "silent" / "episodes.jsonl"
    for path, answers, successes in ((calls, [*right[:3], NO_CALL, NO_CALL, NO_CALL], [1, 1, 1, 0, 1, 1]),
                                     (silent, [NO_CALL] * 4 + [stray, NO_CALL], [0, 0, 0, 0, 0, 1])):
        path.parent.mkdir()
        rows = [episode(q, a, i).replace('"success": null', f'"success": {s}') for i, (q, a, s) in enumerate(zip(questions, answers, successes))]
        path.write_text("".join(rows))
    return calls, silent


def markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Each Markdown table's body rows (cells), under the paragraph line before it."""
    tables, title = {}, None
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if lines[0].startswith("|"):
            tables[title] = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
        else:
            title = lines[-1]
    return tables


def errors_tables(tmp_path: Path, questions: list, answers: dict[str, list[str]]) -> dict[str, list[list[str]]]:
    """scripts/bfcl_errors.py's tables for evaluations ``label → answers`` (one per question, in order)."""
    files = {}
    for label, texts in answers.items():
        files[label] = tmp_path / f"{label}.jsonl"
        files[label].write_text("".join(episode(q, text, i) for i, (q, text) in enumerate(zip(questions, texts))))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), *(f"{k}={v}" for k, v in files.items())],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    return markdown_tables(done.stdout)


def test_mistakes_by_kind_and_the_call_rate_where_a_call_is_due(tmp_path):
    calls, silent = two_evaluations(tmp_path)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), f"calls={calls}", f"silent={silent}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    tables = markdown_tables(done.stdout)
    rates = next(rows for title, rows in tables.items() if title.startswith("Call rate where one is due"))
    assert rates == [["calls", "0.750", "0.750"], ["silent", "0.000", "0.000"]]  # simple_python, then all
    assert tables["simple_python (4 rows), mistakes by kind:"] == [["right", "3", "0"], ["no call", "1", "4"],
                                                                  ["call rate where one is due", "0.750", "0.000"]]
    assert tables["irrelevance (2 rows), mistakes by kind:"] == [["right", "2", "1"], ["call on irrelevance row", "0", "1"]]
    assert tables["all (6 rows), mistakes by kind:"][-1] == ["call rate where one is due", "0.750", "0.000"]
    mixed = tmp_path / "mixed.jsonl"  # a mixture's file: its other sources' rows are left out; irrelevance alone has no call rate
    mixed.write_text(json.dumps({"data_source": "gsm8k", "messages": [], "extra_info": {}}) + "\n"
                     + "".join(line + "\n" for line in silent.read_text().splitlines() if '"irrelevance"' in line))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), f"mixed={mixed}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert markdown_tables(done.stdout) == {
        "No-call rows by the subject words their question shares with the functions (the share answered with no call):":
            [["mixed", "0.500 (n=2)", "—", "—"]],  # "(question N)" shares no word with any function
        "irrelevance (2 rows), mistakes by kind:": [["right", "1"], ["call on irrelevance row", "1"]],
        "all (2 rows), mistakes by kind:": [["right", "1"], ["call on irrelevance row", "1"]]}
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": []}\n')
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), f"x={broken}"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 1 and "broken.jsonl line 1 is not a BFCL episode row with messages and extra_info.category" in done.stderr


def test_calls_right_is_the_share_of_the_calls_made_where_one_is_due_that_bfcl_accepts(tmp_path):
    """Four simple_python rows: ``learnt`` makes two right calls, one wrong and no call once; ``eager`` calls on
    every row, one right; ``silent`` never calls. The call rate counts the calls made, calls right those accepted."""
    simple = load_category("simple_python")[:4]
    right = [as_calls(bfcl.answer_calls(q.ground_truth, q.functions)) for q in simple]
    wrong = [as_calls([{"name": q.functions[0]["name"] + "_x", "arguments": {}}]) for q in simple]
    answers = {"learnt": [right[0], right[1], wrong[2], NO_CALL], "eager": [right[0], wrong[1], wrong[2], wrong[3]], "silent": [NO_CALL] * 4}
    tables = errors_tables(tmp_path, simple, answers)
    rates = next(rows for title, rows in tables.items() if title.startswith("Call rate where one is due"))
    assert rates == [["learnt", "0.750", "0.750"], ["eager", "1.000", "1.000"], ["silent", "0.000", "0.000"]]
    assert next(rows for title, rows in tables.items() if title.startswith("Calls right where one is due")) == [
        ["learnt", "0.667", "0.667"], ["eager", "0.250", "0.250"], ["silent", "—", "—"]]


def test_arguments_per_call_counts_what_the_calls_wrote_where_a_call_is_due(tmp_path):
    """Four simple_python rows and one irrelevance row: ``full`` writes each possible answer whole, ``short`` the same
    calls with their last argument left out; both call on the irrelevance row with three arguments and decline one
    simple_python row. Arguments per call is the mean over the readable calls on the rows that need one: one less for ``short``."""
    simple, irrelevance = load_category("simple_python")[:4], load_category("irrelevance")[0]
    answers = [bfcl.answer_calls(q.ground_truth, q.functions) for q in simple[:3]]
    short = [[{**call, "arguments": dict(list(call["arguments"].items())[:-1])} for call in calls] for calls in answers]
    stray = as_calls([{"name": irrelevance.functions[0]["name"], "arguments": {"a": 1, "b": 2, "c": 3}}])
    tables = errors_tables(tmp_path, [*simple, irrelevance], {"full": [*map(as_calls, answers), NO_CALL, stray],
                                                                "short": [*map(as_calls, short), NO_CALL, stray]})
    written = [len(call["arguments"]) for calls in answers for call in calls]
    assert min(written) >= 1 and len(written) == 3
    mean = sum(written) / len(written)
    assert next(rows for title, rows in tables.items() if title.startswith("Arguments per call where one is due")) == [
        ["full", f"{mean:.3f}", f"{mean:.3f}"], ["short", f"{mean - 1:.3f}", f"{mean - 1:.3f}"]]


def test_calls_per_answer_counts_the_readable_calls_where_a_call_is_due(tmp_path):
    """Three parallel rows (each answer two calls or more) and one irrelevance row: ``whole`` writes each possible
    answer, ``first`` only its first call; both decline the third parallel row and call once on the irrelevance row.
    Neither counts in this table: the irrelevance row needs no call, the declined row made none."""
    parallel, irrelevance = load_category("parallel")[:3], load_category("irrelevance")[0]
    answers = [bfcl.answer_calls(q.ground_truth, q.functions) for q in parallel[:2]]
    assert all(len(calls) >= 2 for calls in answers)
    stray = as_calls([{"name": irrelevance.functions[0]["name"], "arguments": {}}])
    tables = errors_tables(tmp_path, [*parallel, irrelevance], {"whole": [*map(as_calls, answers), NO_CALL, stray],
                                                                 "first": [*(as_calls(calls[:1]) for calls in answers), NO_CALL, stray]})
    mean = sum(map(len, answers)) / len(answers)
    assert next(rows for title, rows in tables.items() if title.startswith("Calls per answer where one is due")) == [
        ["whole", f"{mean:.3f}", f"{mean:.3f}"], ["first", "1.000", "1.000"]]


def test_the_right_number_of_calls_is_counted_apart_by_the_calls_the_answer_wants(tmp_path):
    """A simple_python row (one call wanted) and parallel rows wanting 2, 3 and 4 calls: ``whole`` writes each possible
    answer, ``two`` at most its first two calls (a wrong second call on the simple_python row), and both decline one row
    wanting 2: the share with exactly the wanted number counts the rows with a readable call, right or wrong."""
    simple = load_category("simple_python")[0]
    parallel = {n: [q for q in load_category("parallel") if len(q.ground_truth) == n][:2] for n in (2, 3, 4)}
    questions = [simple, *parallel[2], parallel[3][0], parallel[4][0]]
    answers = [bfcl.answer_calls(q.ground_truth, q.functions) for q in questions]
    extra = {"name": simple.functions[0]["name"], "arguments": {}}
    tables = errors_tables(tmp_path, questions, {"whole": [*map(as_calls, answers[:2]), NO_CALL, *map(as_calls, answers[3:])],
                                                 "two": [as_calls([*answers[0], extra]), as_calls(answers[1][:2]), NO_CALL,
                                                         *(as_calls(calls[:2]) for calls in answers[3:])]})
    assert next(rows for title, rows in tables.items() if title.startswith("Right number of calls by calls wanted")) == [
        ["whole", "1.000 (n=1)", "1.000 (n=1)", "1.000 (n=1)", "1.000 (n=1)"],
        ["two", "0.000 (n=1)", "1.000 (n=1)", "0.000 (n=1)", "0.000 (n=1)"]]


def test_the_first_call_alone_is_judged_where_one_call_is_wanted_and_several_were_made(tmp_path):
    """Four simple_python rows (one call wanted each) and a parallel row wanting two: ``extra`` answers the first with its
    right call then another call, the second with a wrong first call then its right one, the third with its right call
    alone, the fourth with an unreadable call before its right one (its first call written is not read: not counted), and
    the parallel row with its two calls and a third; ``whole`` answers each with its right calls. Only ``extra``'s first
    two rows count, and of those only the first's first call passes."""
    simple = load_category("simple_python")[:4]
    parallel = next(q for q in load_category("parallel") if len(q.ground_truth) == 2)
    answers = [bfcl.answer_calls(q.ground_truth, q.functions) for q in [*simple, parallel]]
    wrong = {"name": simple[1].functions[0]["name"], "arguments": {}}
    tables = errors_tables(tmp_path, [*simple, parallel], {
        "whole": [as_calls(calls) for calls in answers],
        "extra": [as_calls([*answers[0], *answers[0]]), as_calls([wrong, *answers[1]]), as_calls(answers[2]),
                  "<tool_call>{not json</tool_call>" + as_calls(answers[3] * 2), as_calls([*answers[4], answers[4][0]])]})
    assert next(rows for title, rows in tables.items() if title.startswith("First call alone where one call is wanted")) == [
        ["whole", "—"], ["extra", "0.500 (n=2)"]]
    plain = errors_tables(tmp_path, simple, {"whole": [as_calls(calls) for calls in answers[:4]]})
    assert not any(title.startswith("First call alone") for title in plain)


def test_no_call_rows_are_told_apart_by_the_subject_words_their_question_shares_with_the_functions(tmp_path):
    """A question that shares no subject word with its function, one that shares one, one that shares more:
    each answered once with no call (right) and once with a call, in two evaluations."""
    from posttrain.rewards.bfcl_mistakes import SHARED

    question = load_category("irrelevance")[0]
    function = {"name": "get_weather", "description": "Today's forecast for a city"}
    asked = [("Who wrote Hamlet?", "none"), ("Is there a forecast for tomorrow?", "one"), ("Forecast the weather of Paris", "two or more")]
    files = {}
    for label, answers in (("declines", [NO_CALL] * 3), ("calls", [as_calls([{"name": "get_weather", "arguments": {}}])] * 3)):
        rows = []
        for index, ((text, _), answer) in enumerate(zip(asked, answers)):
            row = json.loads(episode(question, answer, index))
            row["messages"][0]["content"], row["extra_info"]["bfcl_functions"] = text, json.dumps([function])
            rows.append(json.dumps(row) + "\n")
        files[label] = tmp_path / f"{label}.jsonl"
        files[label].write_text("".join(rows))
    assert [bucket for _, bucket in asked] == list(SHARED)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bfcl_errors.py"), *(f"{k}={v}" for k, v in files.items())],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr
    table = next(rows for title, rows in markdown_tables(done.stdout).items() if title.startswith("No-call rows by the subject words"))
    assert table == [["declines", "1.000 (n=1)", "1.000 (n=1)", "1.000 (n=1)"], ["calls", "0.000 (n=1)", "0.000 (n=1)", "0.000 (n=1)"]]


def test_a_bfcl_recipe_report_carries_the_mistakes_and_call_rates_of_its_rows(tmp_path):
    calls, silent = two_evaluations(tmp_path)
    recipe = load_recipe("bfcl")
    report = recipe_table(recipe, {"base_eval": silent.parent, "sft_eval": silent.parent, "rl_eval": calls.parent}, {})
    assert "## Mistakes by kind (bfcl)" in report and report.rstrip().endswith("| call rate where one is due | 0.000 | 0.000 | 0.750 |")
    accuracy, _, mistakes = report.partition("## Mistakes by kind (bfcl)")
    assert "| RL − SFT | +0.667" in accuracy  # 5 of 6 right against 1
    tables = markdown_tables(mistakes)
    assert tables["simple_python (4 rows), mistakes by kind:"][-1] == ["call rate where one is due", "0.000", "0.000", "0.750"]
    for path in (calls, silent):  # the same rows from a data source with no such analysis: no mistakes section
        path.write_text(path.read_text().replace('"data_source": "bfcl"', '"data_source": "gsm8k"'))
    report = recipe_table(recipe, {"base_eval": silent.parent, "sft_eval": silent.parent, "rl_eval": calls.parent}, {})
    assert "| RL − SFT | +0.667" in report and "Mistakes by kind" not in report
