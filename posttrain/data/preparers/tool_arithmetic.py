"""Arithmetic a small model cannot do in its head, solvable with the ``calculator`` tool.

Problems are :mod:`~posttrain.data.preparers.arithmetic`'s (``4821 * 739 + 160``), with ``digits``-digit
operands (3 by default: SmolLM2-135M-Instruct gets almost none of these right unaided), asked as
``What is 4821 * 739 + 160?``; the ground truth is the value, and the score is the ``arithmetic``
data source's (the last number of the final answer). Files, all from one seed:

- ``train.parquet`` / ``test.parquet``: RL prompts and the held-out split (no expression shared);
- ``test_longer.parquet``: held-out problems with operands one digit longer than trained;
- ``sft.parquet`` / ``sft_val.parquet`` (``sft_size > 0``): scripted expert transcripts whose tool
  results come from calling the real ``calculator``, drawn from the train problems.

**What SFT leaves to RL.** A fraction ``sft_direct_fraction`` of the transcripts answer at once,
without a call, with the right value — a demonstrator who happens to know the answer. A student
that imitates this answers without the tool about that often, and is then mostly wrong: the model
cannot multiply three-digit numbers. Only RL, rewarded for right answers, can learn that calling
the tool is what pays; the SFT data shows both behaviours and never says which to prefer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.data.format import make_row, write_conversations, write_rows
from posttrain.data.preparers.arithmetic import DATA_SOURCE, Problem, check_problem_space, generate_problems
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError
from posttrain.models.tool_formats.builtin import tool_calls_text, tool_responses
from posttrain.tools.builtin import calculator

TOOL_SPEC = "posttrain.tools:calculator"


def question(problem: Problem) -> str:
    return f"What is {problem.expression}?"


def transcript(problem: Problem, direct: bool) -> list[dict[str, str]]:
    """The expert's conversation: a calculator call, its real result, the answer (or the answer at once)."""
    messages = [{"role": "user", "content": question(problem)}]
    if direct:
        return [*messages, {"role": "assistant", "content": f"{problem.expression} = {problem.value}"}]
    result = calculator(problem.expression)
    return [
        *messages,
        {"role": "assistant", "content": tool_calls_text([{"name": "calculator", "arguments": {"expression": problem.expression}}])},
        {"role": "user", "content": tool_responses([("calculator", result)])},
        {"role": "assistant", "content": f"{problem.expression} = {result}"},
    ]


def checked_options(given: dict[str, Any]) -> None:
    """InputError for what prepare_tool_arithmetic's arguments alone call for (also ``preparers.check_options``'s)."""
    train_size, sft_size, sft_val_size, fraction = given["train_size"], given["sft_size"], given["sft_val_size"], given["sft_direct_fraction"]
    check_counts(1, train_size=train_size, val_size=given["val_size"], longer_size=given["longer_size"], digits=given["digits"])
    check_counts(0, sft_size=sft_size, sft_val_size=sft_val_size)
    if not 0 <= fraction <= 1:
        raise InputError(f"sft_direct_fraction={fraction} must lie in [0, 1]")
    if sft_size + sft_val_size > train_size:
        raise InputError(f"sft_size + sft_val_size = {sft_size + sft_val_size} transcripts are drawn from the {train_size} train problems; lower them")
    for digits, count in ((given["digits"], train_size + given["val_size"]), (given["digits"] + 1, given["longer_size"])):
        check_problem_space(count, digits, given["num_operands"], given["operators"])


def prepare_tool_arithmetic(
    out_dir: Path,
    *,
    train_size: int = 512,
    val_size: int = 128,
    longer_size: int = 128,
    digits: int = 3,
    num_operands: int = 2,
    operators: str = "+-*",
    sft_size: int = 256,
    sft_val_size: int = 32,
    sft_direct_fraction: float = 0.5,
    seed: int = 0,
) -> list[Path]:
    """Write the files of the module docstring into ``out_dir``; returns their paths."""
    checked_options(dict(locals()))
    problems = generate_problems(train_size + val_size, digits=digits, num_operands=num_operands, operators=operators, seed=seed)
    longer = generate_problems(longer_size, digits=digits + 1, num_operands=num_operands, operators=operators, seed=seed + 1)
    out_dir = Path(out_dir)
    splits = {"train": problems[:train_size], "test": problems[train_size:], "test_longer": longer}
    paths = [write_rows([_row(p, split, i) for i, p in enumerate(items)], out_dir / f"{split}.parquet") for split, items in splits.items()]
    if sft_size:
        sft = problems[:sft_size + sft_val_size]
        # every k-th transcript answers at once, so the share is exact and spread over the file
        direct = [round((i + 1) * sft_direct_fraction) > round(i * sft_direct_fraction) for i in range(len(sft))]
        conversations = [transcript(p, d) for p, d in zip(sft, direct)]
        paths.append(write_conversations(conversations[:sft_size], out_dir / "sft.parquet"))
        if sft_val_size:
            paths.append(write_conversations(conversations[sft_size:], out_dir / "sft_val.parquet"))
    return paths


def _row(problem: Problem, split: str, index: int) -> dict:
    return make_row(
        data_source=DATA_SOURCE, messages=[{"role": "user", "content": question(problem)}], ground_truth=str(problem.value),
        ability="arithmetic", extra_info={"split": split, "index": index, "expression": problem.expression},
    )
