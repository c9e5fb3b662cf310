"""Hostile tools and hostile calls through the ToolBox: every failure comes back as a result, none raises."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from posttrain.tools import ERROR_KINDS, ParsedCall, ToolBox, load_tools
from posttrain.tools.execute import MAX_ERROR_CHARS

HOSTILE = '''
import asyncio
import os
import time


def echo(text: str, n: int = 0) -> str:
    """Return the text with the number."""
    return f"{text}{n}"


def flood(megabytes: int) -> str:
    """Return a huge string."""
    return "x" * (megabytes * 1_000_000)


def raw_bytes() -> bytes:
    """Return bytes that are not UTF-8."""
    return b"ok \\xff\\xfe\\xc3 end"


def surrogates() -> str:
    """Return a str with lone surrogates."""
    return "left \\ud800 mid \\udfff right"


def hang() -> str:
    """Never return."""
    time.sleep(60)
    return "woke"


def die() -> str:
    """Kill the process."""
    os._exit(1)


def fail(reason: str) -> str:
    """Raise."""
    raise ValueError(f"cannot do {reason}")


def shout(n: int) -> str:
    """Raise with a long message."""
    raise RuntimeError("e" * n)


def items(tags: list[str]) -> int:
    """Count tags."""
    return len(tags)


def mapping() -> dict:
    """Return a dict."""
    return {"a": [1, 2], "b": None}


async def later(text: str) -> str:
    """Return the text after a pause."""
    await asyncio.sleep(0.01)
    return text[::-1]
'''
NAMES = ["echo", "flood", "raw_bytes", "surrogates", "hang", "die", "fail", "shout", "items", "mapping", "later"]
TIMEOUT_S = 2.0

# a call that hangs the test instead of failing it is a containment bug: fail instead
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tool_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "hostile.py"
    path.write_text(textwrap.dedent(HOSTILE))
    return path


@pytest.fixture(scope="module")
def box(tool_file):
    """One box for the module (its child process is reused, as in a run), results cut at 1000 characters."""
    toolbox = ToolBox(load_tools([f"{tool_file}:{name}" for name in NAMES], max_chars=1000), timeout_s=TIMEOUT_S)
    yield toolbox
    toolbox.close()


def call(name: str, **arguments) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments))


def test_a_plain_call_succeeds(box):
    (result,) = box.run([call("echo", text="hi", n=3)])
    assert result.ok and result.name == "echo" and result.text == "hi3"


def test_huge_output_is_cut_where_it_ran(box):
    """50 MB of result come back as max_chars characters and a note saying so, quickly."""
    started = time.monotonic()
    (result,) = box.run([call("flood", megabytes=50)])
    assert time.monotonic() - started < 15
    assert result.ok
    assert result.text.startswith("x" * 1000) and result.text.endswith("(cut at 1000 characters)")
    assert len(result.text) < 1100


def test_bytes_that_are_not_utf8_become_text_with_replacements(box):
    (result,) = box.run([call("raw_bytes")])
    assert result.ok and isinstance(result.text, str)
    assert result.text.startswith("ok ") and result.text.endswith(" end") and "\ufffd" in result.text


def test_lone_surrogates_become_encodable_text(box):
    """A str that cannot be encoded comes back as one that can, its readable parts kept."""
    (result,) = box.run([call("surrogates")])
    assert result.ok
    result.text.encode("utf-8")  # raises on a lone surrogate
    assert "left" in result.text and "mid" in result.text and "right" in result.text


def test_other_results_come_back_as_json(box):
    """A dict result is JSON text; empty arguments mean no arguments."""
    (result,) = box.run([ParsedCall("mapping", "")])
    assert result.ok and json.loads(result.text) == {"a": [1, 2], "b": None}


def test_a_hanging_tool_times_out_and_the_next_call_runs(box):
    """The hang is stopped at about the timeout; a call after it in the same run still succeeds."""
    started = time.monotonic()
    hung, after = box.run([call("hang"), call("echo", text="after")])
    elapsed = time.monotonic() - started
    assert hung.error == "timeout" and hung.name == "hang"
    assert hung.text.startswith("Error (timeout):") and f"{TIMEOUT_S:g} s" in hung.text
    assert after.ok and after.text == "after0"
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 20  # the deadline, plus starting a fresh child


def test_a_tool_that_kills_its_process_is_crashed_and_the_box_goes_on(box):
    died, after = box.run([call("die"), call("echo", text="alive")])
    assert died.error == "crashed" and "process died" in died.text
    assert after.ok and after.text == "alive0"
    (again,) = box.run([call("echo", text="next run")])
    assert again.ok and again.text == "next run0"


def test_an_exception_names_the_error_but_not_where_it_was_raised(box, tool_file):
    (result,) = box.run([call("fail", reason="that")])
    assert result.error == "exception"
    assert "ValueError: cannot do that" in result.text
    assert str(tool_file.parent) not in result.text and "hostile.py" not in result.text and "in fail" not in result.text


def test_a_huge_exception_message_is_cut(box):
    """A tool that raises with megabytes of text floods no observation."""
    (result,) = box.run([call("shout", n=5_000_000)])
    assert result.error == "exception" and result.text.startswith("Error (exception): RuntimeError: eee")
    assert len(result.text) <= MAX_ERROR_CHARS + 100 and "cut at" in result.text


def test_an_exception_echoing_crafted_arguments_is_handled_quickly(box):
    """Text shaped like the " (file:line in name)" suffix, repeated, must not stall the caller."""
    crafted = "(" + ":1 in " * 16_000 + ")"
    started = time.monotonic()
    (result,) = box.run([call("fail", reason=crafted)])
    assert time.monotonic() - started < 3  # a backtracking strip took seconds for this
    assert result.error == "exception" and "ValueError: cannot do (:1 in" in result.text


def test_deeply_nested_arguments_are_bad_json(box):
    """100000 levels of ``[`` exceed the parser's nesting: an error for the model, not a RecursionError."""
    (result,) = box.run([ParsedCall("items", "[" * 100_000)])
    assert result.error == "bad_json" and result.text.startswith("Error (bad_json):")
    (nested,) = box.run([ParsedCall("items", '{"tags": ' + "[" * 40_000 + "]" * 40_000 + "}")])
    assert nested.error == "bad_json"


def test_unparseable_arguments_are_bad_json(box):
    (result,) = box.run([ParsedCall("echo", '{"text": "unterminated')])
    assert result.error == "bad_json"


def test_arguments_over_the_limit_are_too_large(box):
    """1 MB of arguments is refused before it is parsed, the message giving the limit."""
    (result,) = box.run([call("echo", text="y" * 1_000_000)])
    assert result.error == "too_large" and str(box.max_argument_chars) in result.text


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ('{"text": "a", "n": "five"}', "'five' is not of type 'integer'"),
        ('{"n": 1}', "'text' is a required property"),
        ('{"text": 5}', "5 is not of type 'string'"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
    ],
    ids=["wrong-type", "missing", "int-for-str", "array", "string"],
)
def test_arguments_against_the_schema_are_bad_arguments(box, arguments, words):
    (result,) = box.run([ParsedCall("echo", arguments)])
    assert result.error == "bad_arguments" and words in result.text


def test_list_items_are_checked(box):
    (bad,) = box.run([call("items", tags=["a", 2])])
    assert bad.error == "bad_arguments"
    (good,) = box.run([call("items", tags=["a", "b"])])
    assert good.ok and good.text == "2"


def test_an_unknown_tool_lists_the_tools(box):
    (result,) = box.run([call("rm_rf", path="/")])
    assert result.error == "unknown_tool" and result.name == "rm_rf"
    assert "'rm_rf'" in result.text and "echo" in result.text and "later" in result.text
    (long,) = box.run([ParsedCall("z" * 10_000, "{}")])  # the model's made-up name is not echoed whole
    assert long.error == "unknown_tool" and len(long.text) < 1000


def test_several_calls_keep_their_order(box):
    """Failed checks, successes and a timeout in one run come back in call order."""
    calls = [call("echo", text="a", n=1), call("nope"), call("echo", text="b", n=2), ParsedCall("echo", "{"),
             call("hang"), call("later", text="xyz"), call("echo", text="c", n=3)]
    results = box.run(calls)
    assert [r.name for r in results] == ["echo", "nope", "echo", "echo", "hang", "later", "echo"]
    assert [r.error for r in results] == [None, "unknown_tool", None, "bad_json", "timeout", None, None]
    assert [r.text for r in results if r.ok] == ["a1", "b2", "zyx", "c3"]


def test_an_async_tool_returns_its_value(box):
    (result,) = box.run([call("later", text="abc")])
    assert result.ok and result.text == "cba"


def test_no_calls_no_results(box):
    assert box.run([]) == []


def test_every_error_kind_is_a_known_one(box):
    """The kinds the box reports are the ones the metrics count."""
    results = box.run([call("nope"), ParsedCall("echo", "{"), ParsedCall("echo", "[]"), call("fail", reason="x"),
                       call("echo", text="y" * 200_000)])
    assert {r.error for r in results} == {"unknown_tool", "bad_json", "bad_arguments", "exception", "too_large"}
    assert {r.error for r in results} <= set(ERROR_KINDS)
