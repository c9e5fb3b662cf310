"""The built-in tools: the calculator's exact arithmetic and refusals, the python tool's limits."""

from __future__ import annotations

import random
import socket
import time

import pytest

from posttrain.tools import calculator, python, sandbox

NETWORK_NOTE = "cannot cut the program's network access"


def random_expression(rng: random.Random, depth: int = 0) -> str:
    """An expression of small integers, + - * // % and short powers, with parentheses and unary minus."""
    if depth > 3 or rng.random() < 0.3:
        number = str(rng.randint(0, 99))
        return f"-{number}" if rng.random() < 0.2 else number
    op = rng.choice(["+", "-", "*", "//", "%", "**"])
    if op == "**":
        return f"({random_expression(rng, depth + 1)}) ** {rng.randint(0, 3)}"
    return f"({random_expression(rng, depth + 1)} {op} {random_expression(rng, depth + 1)})"


def test_calculator_matches_python_integer_arithmetic():
    """Random integer expressions give exactly Python's value; a zero divisor is a ValueError."""
    rng = random.Random(1234)
    checked = refused = 0
    for _ in range(300):
        expression = random_expression(rng)
        try:
            expected = eval(expression)  # the reference: Python's own arithmetic on a test-built string
        except ZeroDivisionError:
            with pytest.raises(ValueError, match="division by zero"):
                calculator(expression)
            refused += 1
            continue
        assert calculator(expression) == str(expected), expression
        checked += 1
    assert checked > 200 and refused > 0  # both paths were exercised


def test_calculator_true_division_and_exact_big_integers():
    assert calculator("(1234 + 5) * 678") == str((1234 + 5) * 678)
    assert calculator("7 / 2") == "3.5"
    assert calculator("10 / 4 * 2") == "5"  # an integral float is shown as an integer
    assert calculator("2 ** 64 - 1") == "18446744073709551615"
    assert calculator("123456789 ** 8") == str(123456789**8)
    assert float(calculator("1 / 3")) == pytest.approx(1 / 3)
    assert calculator("  -(3 - 10) % 4 ") == str(-(3 - 10) % 4)


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "a + 1", "(1).real", "abs(-1)", "'a' * 3", "[1, 2]", "1 < 2", "True + 1", "~1", "x := 1",
     "1 if 1 else 2", "1 +", ""],
)
def test_calculator_refuses_anything_but_arithmetic(expression):
    """Names, calls, attributes, strings, comparisons and bad syntax are ValueErrors, never evaluated."""
    with pytest.raises(ValueError):
        calculator(expression)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("2 ** 65", "exponents above 64"),
        ("9 ** 64 ** 64", "exponents above 64"),
        ("10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64", "more than 400 digits"),
        ("1 / 0", "division by zero"),
        ("5 // (3 - 3)", "division by zero"),
        ("2.5 % 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1e300 ** 2", "too large"),
        ("10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 16 / 1", "too large"),
        ("-" * 5000 + "1", "nested too deeply"),
        ("1+" * 5000 + "1", "nested too deeply"),
    ],
)
def test_calculator_refuses_results_it_will_not_compute(expression, reason):
    """Each is a ValueError saying why, and none takes long."""
    started = time.monotonic()
    with pytest.raises(ValueError, match=reason):
        calculator(expression)
    assert time.monotonic() - started < 2


def test_python_returns_printed_output():
    """stdout, then stderr, stripped; exit code 0 adds nothing."""
    output = python("import sys\nprint('hello')\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert [line for line in output.splitlines() if line] == ["hello", "42", "warn"]
    assert "exit code" not in output


def test_python_without_output_says_so():
    assert python("x = 1").startswith("(no output)")


def test_python_reports_an_exception_with_its_exit_code():
    output = python("print('before')\n1 / 0")
    assert output.startswith("before") and "ZeroDivisionError" in output and "(exit code 1)" in output


def test_python_stops_an_infinite_loop_at_its_timeout():
    started = time.monotonic()
    output = python("while True:\n    pass", timeout_s=1)
    assert time.monotonic() - started < 10
    assert "more than 1 s and was stopped" in output


def test_python_cannot_allocate_4_gib():
    """The address-space limit makes a 4 GiB allocation a MemoryError inside the program."""
    output = python("x = bytearray(4 << 30)\nprint('allocated', len(x))")
    assert "MemoryError" in output and "allocated" not in output and "exit code" in output


def test_python_cannot_write_a_large_file():
    output = python("open('big', 'wb').write(b'x' * (4 << 20))\nprint('written')")
    assert "File too large" in output and "written" not in output


def test_python_runs_in_an_empty_directory_with_a_clean_environment(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    output = python("import os\nprint(os.listdir('.'))\nprint(dict(os.environ))")
    assert output.startswith("[]") and "hunter2" not in output and "POSTTRAIN_TEST_SECRET" not in output


def test_python_output_is_capped():
    assert len(python("print('x' * 100_000)")) < 8200


CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    print("CONNECTED")
except OSError as error:
    print("NO CONNECTION", type(error).__name__)
"""


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    yield server
    server.close()


def accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except TimeoutError:
        return False


def test_python_network_is_cut_where_the_system_allows(listener):
    """With a network namespace (bubblewrap's, or unshare's) the program cannot reach a local listening socket;
    without one it says so."""
    output = python(CONNECT.format(port=listener.getsockname()[1]))
    if sandbox.bwrap_problem() is None or sandbox.can_cut_network():
        assert "NO CONNECTION" in output and "CONNECTED" not in output.replace("NO CONNECTION", "")
        assert not accepted(listener) and NETWORK_NOTE not in output
    else:
        assert NETWORK_NOTE in output


def test_python_without_network_cut_connects_and_carries_the_note(listener, monkeypatch):
    """Where the network cannot be cut (no bwrap, no unshare) the program does reach the socket (so the check
    above can fail), and the output warns about it."""
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(sandbox, "can_cut_network", lambda: False)
    output = python(CONNECT.format(port=listener.getsockname()[1]))
    assert output.startswith("CONNECTED") and accepted(listener)
    assert NETWORK_NOTE in output


def test_python_s_timeout_is_held_between_a_tenth_of_a_second_and_30_seconds(monkeypatch):
    """Whatever the model asks for: a program never runs past 30 s, nor gets less than 0.1 s."""
    from posttrain.tools import builtin
    from posttrain.tools.sandbox import Finished

    asked = []

    def fake_run(code, timeout_s):
        asked.append(timeout_s)
        return Finished(b"ok", b"", 0, timed_out=False, output_cut=False, network_cut=True)

    monkeypatch.setattr(builtin, "run_python", fake_run)
    for wanted in (1000, "45", 0, -3, 7.5):
        assert builtin.python("print('ok')", timeout_s=wanted) == "ok"
    assert asked == [30.0, 30.0, 0.1, 0.1, 7.5]
