"""GSM8K (grade-school math word problems) in verl's row format, from the copy vendored in this package.

Each problem becomes one user message: the question followed by :data:`INSTRUCTION`, which asks for
the final answer after ``####`` — the form :func:`posttrain.rewards.gsm8k.compute_score` reads
(strict mode). The ground truth is the number after ``####`` on the answer's last line, commas
removed (``"1,000"`` → ``"1000"``). ``extra_info`` keeps the split, the row index and the original
question and worked answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from posttrain.data.format import make_row, write_rows

DATA_SOURCE = "openai/gsm8k"
VENDORED_DIR = Path(__file__).resolve().parent.parent / "vendor" / "gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"####\s*(.+?)\s*$")


def final_answer(worked_answer: str) -> str:
    """The number after ``####`` in a GSM8K answer, commas removed; ValueError if there is none."""
    found = _FINAL_ANSWER.search(worked_answer.strip())
    if found is None:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {worked_answer[-80:]!r}")
    return found.group(1).replace(",", "")


def prepare_gsm8k(out_dir: Path, *, limit: int | None = None, source_dir: Path = VENDORED_DIR) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths.

    ``limit`` keeps only the first ``limit`` problems of each split (small runs on a CPU).
    """
    written = []
    for split in ("train", "test"):
        problems = _read_jsonl(Path(source_dir) / f"{split}.jsonl")[:limit]
        rows = [_row(problem, split, index) for index, problem in enumerate(problems)]
        written.append(write_rows(rows, Path(out_dir) / f"{split}.parquet"))
    return written


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file {path} is missing; reinstall posttrain (it ships {VENDORED_DIR})")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _row(problem: dict[str, str], split: str, index: int) -> dict:
    question, answer = problem["question"], problem["answer"]
    return make_row(
        data_source=DATA_SOURCE,
        messages=[{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        ground_truth=final_answer(answer),
        ability="math",
        extra_info={"split": split, "index": index, "question": question, "answer": answer},
    )
