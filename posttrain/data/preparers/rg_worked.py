"""Worked solutions for reasoning-gym items: the steps a person writes, then the library's answer in its tag.

``posttrain prepare reasoning-gym sft_solution=worked`` writes SFT transcripts whose assistant turn shows the
work before ``<answer>…</answer>``, so that a small model learns steps that RL can then make more reliable
(a direct answer leaves GRPO only whole answers to choose between). Each step is derived from the item's own
``metadata`` (its expression, its animals, its word) with the library's own tables (the legs per animal), and the
result is checked against the library's answer: a writer that disagrees with the library raises, naming the item.

Tasks with a writer: ``basic_arithmetic`` and ``chain_sum`` (chains of ``+``/``-`` of at least two terms, single
spaces, no parentheses: :func:`check_configs` refuses any other config before a file is written), ``leg_counting``,
``spell_backward``. Any other task is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.errors import InputError
from posttrain.rewards import reasoning_gym as rg

Steps = tuple[list[str], str]  # the lines, and the result the last one reaches


def left_to_right(expression: str) -> Steps:
    """Steps of a ``+``/``-`` chain, one operation a line: ``0 - 4 = -4``, ``-4 - 8 = -12``."""
    parts = expression.split()
    if len(parts) < 3 or len(parts) % 2 == 0 or any(op not in ("+", "-") for op in parts[1::2]):
        raise ValueError(f"expression {expression!r} is not a chain of + and - between two or more numbers")
    total, steps = int(parts[0]), []
    for op, term in zip(parts[1::2], parts[2::2], strict=True):
        new = total + int(term) if op == "+" else total - int(term)
        steps.append(f"{total} {op} {term} = {new}")
        total = new
    return steps, str(total)


def arithmetic_steps(entry: dict[str, Any]) -> Steps:
    return left_to_right(entry["metadata"]["expression"])


def leg_steps(entry: dict[str, Any]) -> Steps:
    legs = rg.library("reasoning_gym.arithmetic.leg_counting").ANIMALS
    counts = [(animal, count, legs[animal]) for animal, count in entry["metadata"]["animals"].items()]
    steps = [f"{animal}: {count} × {each} legs = {count * each}" for animal, count, each in counts]
    total = sum(count * each for _, count, each in counts)
    if len(counts) > 1:
        steps.append(" + ".join(str(count * each) for _, count, each in counts) + f" = {total}")
    return steps, str(total)


def spelling_steps(entry: dict[str, Any]) -> Steps:
    word = entry["metadata"]["word"]
    return [f"{word}: {' '.join(word)}", f"backward: {' '.join(reversed(word))}"], word[::-1]


WRITERS: dict[str, Callable[[dict[str, Any]], Steps]] = {
    "basic_arithmetic": arithmetic_steps,
    "chain_sum": arithmetic_steps,
    "leg_counting": leg_steps,
    "spell_backward": spelling_steps,
}
# the config fields under which the arithmetic writers' chains hold (the library's defaults where a config omits them)
CHAIN_FIELDS = {"operators": lambda ops: set(ops) <= {"+", "-"}, "allow_parentheses": lambda value: not value,
                "whitespace": lambda value: value == "single", "min_terms": lambda value: value >= 2}


def check_configs(configs: dict[str, dict[str, Any]]) -> None:
    """Refuse ``sft_solution=worked`` for a task no writer covers, or a config whose items it cannot write."""
    missing = [task for task in configs if task not in WRITERS]
    if missing:
        raise InputError(f"sft_solution=worked: no worked-solution writer for {missing}; the tasks with one are "
                         f"{sorted(WRITERS)} (or pass sft_solution=answer for the answer alone)")
    for task, config in configs.items():
        if WRITERS[task] is not arithmetic_steps:
            continue
        full = rg.dataset(task, config, 0, 1).config  # the library's config class, its defaults filled in
        wrong = {name: getattr(full, name) for name, holds in CHAIN_FIELDS.items()
                 if hasattr(full, name) and not holds(getattr(full, name))}
        if wrong:
            raise InputError(f"sft_solution=worked: task {task!r}'s worked steps cover chains of + and - of two or more "
                             f"terms with single spaces and no parentheses; its config has {wrong} (the library's default "
                             f"where not set): set configs.{task} to operators [+, -], allow_parentheses false, "
                             "whitespace single, min_terms >= 2, or pass sft_solution=answer")


def worked_solution(entry: dict[str, Any], task: str) -> str:
    """The assistant turn: the steps, then ``<answer>ANSWER</answer>`` with the library's answer."""
    item = entry["metadata"].get("source_index")
    try:
        steps, result = WRITERS[task](entry)
    except (ValueError, KeyError) as error:
        raise InputError(f"sft_solution=worked: task {task!r} item {item} ({entry['question']!r}) is outside what "
                         f"its writer covers: {error}") from None
    if result != str(entry["answer"]):
        raise InputError(f"sft_solution=worked: task {task!r} item {item}: the worked steps reach {result!r} but the "
                         f"library's answer is {entry['answer']!r}")
    return "\n".join(steps) + f"\n<answer>{entry['answer']}</answer>"
