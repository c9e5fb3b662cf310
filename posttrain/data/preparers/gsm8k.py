"""GSM8K (grade-school math word problems) in verl's row format: from the Hugging Face Hub dataset
``openai/gsm8k`` (its ``main`` config) when it is in huggingface_hub's cache or reachable, else from
the copy vendored in this package (the same problems, MIT licence beside it); which one was used is
printed.

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
from typing import Any

from posttrain.data.format import make_row, write_rows
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError, MissingFileError

DATA_SOURCE = "openai/gsm8k"
HUB_FILES = {"train": "main/train-00000-of-00001.parquet", "test": "main/test-00000-of-00001.parquet"}
VENDORED_DIR = Path(__file__).resolve().parent.parent / "vendor" / "gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"####\s*(.+?)\s*$")


def final_answer(worked_answer: str) -> str:
    """The number after ``####`` in a GSM8K answer, commas removed; ValueError if there is none."""
    found = _FINAL_ANSWER.search(worked_answer.strip())
    if found is None:
        raise InputError(f"GSM8K answer has no '#### <number>' line: {worked_answer[-80:]!r}")
    return found.group(1).replace(",", "")


def checked_options(given: dict[str, Any]) -> None:
    """InputError for what prepare_gsm8k's arguments alone call for (also ``preparers.check_options``'s)."""
    if given["limit"] is not None:
        check_counts(1, limit=given["limit"])


def prepare_gsm8k(out_dir: Path, *, limit: int | None = None, source_dir: Path = VENDORED_DIR) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths.

    ``limit`` keeps only the first ``limit`` problems of each split (small runs on a CPU). A
    ``source_dir`` other than the vendored copy is read as it is (``train.jsonl``, ``test.jsonl``).
    """
    checked_options(dict(locals()))
    written = []
    for split in ("train", "test"):
        problems = _read_jsonl(Path(source_dir) / f"{split}.jsonl") if Path(source_dir) != VENDORED_DIR else _problems(split)
        problems = problems[:limit]
        rows = [_row(problem, split, index) for index, problem in enumerate(problems)]
        written.append(write_rows(rows, Path(out_dir) / f"{split}.parquet"))
    return written


def _problems(split: str) -> list[dict[str, str]]:
    """The split from the Hub (cached or downloaded), else the vendored copy; says which."""
    import sys

    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(DATA_SOURCE, HUB_FILES[split], repo_type="dataset")
    except Exception as err:  # noqa: BLE001 - offline, unreachable, or not cached: the vendored copy is the same data
        print(f"posttrain: GSM8K {split} from the copy vendored in posttrain (the Hub: {type(err).__name__})", file=sys.stderr)
        return vendored(split)
    import pyarrow.parquet as pq

    print(f"posttrain: GSM8K {split} from the Hugging Face Hub ({DATA_SOURCE}, {path})", file=sys.stderr)
    return [{"question": row["question"], "answer": row["answer"]} for row in pq.read_table(path).to_pylist()]


def vendored(split: str) -> list[dict[str, str]]:
    """The split's problems (``question``, ``answer``) from the copy vendored in posttrain, read offline."""
    return _read_jsonl(VENDORED_DIR / f"{split}.jsonl")


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise MissingFileError(f"GSM8K file {path} is missing; reinstall posttrain (it ships {VENDORED_DIR})")
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
