"""The built-in tools: ``posttrain.tools:calculator``, ``posttrain.tools:python``, ``posttrain.tools:search``.

calculator  arithmetic on numbers (``+ - * / // % **``, parentheses, unary signs), read with Python's
            ``ast`` and evaluated node by node: no ``eval``, no names, no calls. Powers are kept to
            exponents up to 64 and results to 400 digits, so no expression can stall the process.
python      runs code in a fresh ``python -I`` process (isolated mode: no user site, no PYTHON*
            variables, the working directory not on the path) with a wall-clock timeout, CPU, memory,
            file-size and process limits: in a bubblewrap sandbox where ``bwrap`` works (no network, a
            read-only system, no home directory or checkout, an empty scratch dir; every process of the
            program killed at the end), else with the limits only and a warning (``sandbox.py`` says
            exactly what is and is not isolated). The first 8,000 characters of its output are returned,
            with a note when it was stopped (timeout, over 1 MiB of output) or exited with an error.
search      the retriever service as a tool: the query's top hits, formatted as the search agent
            shows them. It calls the service at ``$POSTTRAIN_RETRIEVER_URL``, which a run sets when
            ``env.tools`` lists this tool (the retriever is started or connected as for ``env.name=search``).
"""

from __future__ import annotations

import ast
import operator
import os

from posttrain.tools.sandbox import MAX_OUTPUT_BYTES, run_python

RETRIEVER_URL_VAR = "POSTTRAIN_RETRIEVER_URL"
SEARCH_TOPK = 3  # the passages one search shows
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_DIGITS = 400
OUTPUT_CHARS = 8000


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. "(1234 + 5) * 678".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    except (RecursionError, MemoryError):  # e.g. thousands of unary minus signs
        raise ValueError("the expression is nested too deeply") from None
    try:
        value = _evaluate(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents above {MAX_EXPONENT} are not computed")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:  # a float power past 1e308, or an int too large to divide as a float
            raise ValueError("the result is too large") from None
        if isinstance(value, int) and abs(value).bit_length() > MAX_DIGITS * 3.33:
            raise ValueError(f"the result has more than {MAX_DIGITS} digits")
        if isinstance(value, complex):
            raise ValueError("the result is not a real number")
        return value
    raise ValueError(f"{ast.unparse(node)!r} is not allowed: only numbers, + - * / // % ** and parentheses")


def python(code: str, timeout_s: float = 5.0) -> str:
    """Run a Python program and return what it printed (stdout, then stderr).

    Args:
        code: The program. Print what you want to see; the last expression is not shown on its own.
        timeout_s: Seconds the program may run.
    """
    timeout_s = min(max(float(timeout_s), 0.1), 30.0)
    done = run_python(code, timeout_s)
    output = (done.stdout + (b"\n" + done.stderr if done.stderr else b"")).decode("utf-8", errors="replace")[:OUTPUT_CHARS]
    notes = [f"the program ran for more than {timeout_s:g} s and was stopped"] if done.timed_out else []
    if done.output_cut:
        notes.append(f"the program printed more than {MAX_OUTPUT_BYTES >> 20} MiB and was stopped")
    if done.returncode:
        notes.append(f"exit code {done.returncode}")
    if not done.network_cut:
        notes.append("note: this system cannot cut the program's network access")
    return (output.strip() or "(no output)") + "".join(f"\n({note})" for note in notes)



def search(query: str) -> str:
    """Search the document collection and return the best-matching passages.

    Args:
        query: What to look for, e.g. a name or a question.
    """
    from posttrain.agents.retriever.client import RetrieverClient

    url = os.environ.get(RETRIEVER_URL_VAR)
    if not url:
        raise RuntimeError(f"no retriever: ${RETRIEVER_URL_VAR} is not set (a run sets it when env.tools lists posttrain.tools:search)")
    client = RetrieverClient(url, token=os.environ.get("POSTTRAIN_RETRIEVER_TOKEN") or None)
    try:
        return shown_hits(client.retrieve([query.strip()[:300]], SEARCH_TOPK)[0])
    finally:
        client.close()


def shown_hits(hits) -> str:
    """What :func:`search` returns for the retriever's ``hits`` (Search-R1's ``<information>`` block)."""
    from posttrain.agents.search import format_hits

    return format_hits(hits).strip()
