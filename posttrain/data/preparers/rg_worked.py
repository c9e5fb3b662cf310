"""Worked solutions for reasoning-gym items: the steps a person writes, then the library's answer in its tag.

``posttrain prepare reasoning-gym sft_solution=worked`` writes SFT transcripts whose assistant turn shows the
work before ``<answer>…</answer>``, so that a small model learns steps that RL can then make more reliable
(a direct answer leaves GRPO only whole answers to choose between). Each step is derived from the item's own
``metadata`` (its expression, its animals, its word) with the library's own tables (the legs per animal), and the
result is checked against the library's answer: a writer that disagrees with the library raises, naming the item.

Tasks with a writer: ``basic_arithmetic`` (``+``/``-`` without parentheses), ``chain_sum``, ``leg_counting``,
``spell_backward``. Any other task, or a config outside what its writer covers, is refused before a file is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.errors import InputError
from posttrain.rewards import reasoning_gym as rg


def left_to_right(expression: str) -> list[str]:
    """Steps of a ``+``/``-`` chain, one operation a line: ``0 - 4 = -4``, ``-4 - 8 = -12``."""
    parts = expression.split()
    if len(parts) % 2 == 0 or any(op not in "+-" or len(op) != 1 for op in parts[1::2]):
        raise ValueError(f"expression {expression!r} is not a chain of + and - between numbers")
    total, steps = int(parts[0]), []
    for op, term in zip(parts[1::2], parts[2::2], strict=True):
        new = total + int(term) if op == "+" else total - int(term)
        steps.append(f"{total} {op} {term} = {new}")
        total = new
    return steps


def arithmetic_steps(entry: dict[str, Any]) -> list[str]:
    return left_to_right(entry["metadata"]["expression"])


def leg_steps(entry: dict[str, Any]) -> list[str]:
    legs = rg.library("reasoning_gym.arithmetic.leg_counting").ANIMALS
    counts = [(animal, count, legs[animal]) for animal, count in entry["metadata"]["animals"].items()]
    steps = [f"{animal}: {count} × {each} legs = {count * each}" for animal, count, each in counts]
    if len(counts) > 1:
        steps.append(" + ".join(str(count * each) for _, count, each in counts) + f" = {sum(c * e for _, c, e in counts)}")
    return steps


def spelling_steps(entry: dict[str, Any]) -> list[str]:
    word = entry["metadata"]["word"]
    return [f"{word}: {' '.join(word)}", f"backward: {' '.join(reversed(word))}"]


WRITERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "basic_arithmetic": arithmetic_steps,
    "chain_sum": arithmetic_steps,
    "leg_counting": leg_steps,
    "spell_backward": spelling_steps,
}


def check_tasks(tasks: list[str]) -> None:
    """Refuse ``sft_solution=worked`` for a task no writer covers."""
    missing = [task for task in tasks if task not in WRITERS]
    if missing:
        raise InputError(f"sft_solution=worked: no worked-solution writer for {missing}; the tasks with one are "
                         f"{sorted(WRITERS)} (or pass sft_solution=answer for the answer alone)")


def worked_solution(entry: dict[str, Any], task: str) -> str:
    """The assistant turn: the steps, then ``<answer>ANSWER</answer>`` with the library's answer."""
    try:
        steps = WRITERS[task](entry)
    except (ValueError, KeyError) as error:
        raise InputError(f"sft_solution=worked: task {task!r} item {entry['metadata'].get('source_index')} "
                         f"({entry['question']!r}) is outside what its writer covers: {error}") from None
    last = steps[-1].rsplit(" ", 1)[-1] if task != "spell_backward" else steps[-1].split(": ", 1)[1].replace(" ", "")
    if last != str(entry["answer"]):
        raise InputError(f"sft_solution=worked: task {task!r} item {entry['metadata'].get('source_index')}: the worked "
                         f"steps end at {last!r} but the library's answer is {entry['answer']!r}")
    return "\n".join(steps) + f"\n<answer>{entry['answer']}</answer>"
