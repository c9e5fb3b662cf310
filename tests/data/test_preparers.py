"""Preparers: arithmetic (seeded, disjoint splits, right answers) and GSM8K (rows and ground truths);
`posttrain prepare` refusing bad sizes and unwritable outputs before writing anything."""

import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from posttrain.cli import main
from posttrain.data import parse_options, prepare, preparer_names, read_rows
from posttrain.data.preparers import check_options, get_preparer
from posttrain.data.preparers.arithmetic import Problem, generate_problems
from posttrain.data.preparers.gsm8k import INSTRUCTION, VENDORED_DIR, final_answer
from posttrain.errors import InputError


def _rows(path):
    return pq.read_table(path).to_pylist()


def test_registry_and_option_errors(tmp_path):
    assert preparer_names() == ["arithmetic", "bfcl", "doctor", "gsm8k", "reasoning-gym", "synthetic-doctor", "synthetic-search", "textarena", "tool-arithmetic"]
    assert all(callable(get_preparer(name)) for name in preparer_names())  # each "module:function", imported when asked for, resolves
    # and its module has the check of its options alone that the config check runs (preparers' module docstring)
    assert all(callable(sys.modules[get_preparer(name).__module__].checked_options) for name in preparer_names())
    with pytest.raises(ValueError, match="unknown dataset 'mnist'.*'arithmetic', 'bfcl', 'doctor', 'gsm8k'"):
        prepare("mnist", tmp_path)
    with pytest.raises(ValueError, match="bad options \\['size'\\].*train_size=240"):
        prepare("arithmetic", tmp_path, size=3)


def test_parse_options_converts_by_annotation():
    assert parse_options("arithmetic", ["train_size=10", "operators=+-", "seed=7"]) == {"train_size": 10, "operators": "+-", "seed": 7}
    assert parse_options("gsm8k", ["limit=none"]) == {"limit": None}
    assert parse_options("gsm8k", ["limit=5"]) == {"limit": 5}
    with pytest.raises(ValueError, match="train_size='ten': expected a value of type int"):
        parse_options("arithmetic", ["train_size=ten"])
    with pytest.raises(ValueError, match="key=value with a key among"):
        parse_options("arithmetic", ["colour=red"])


def test_problem_values_by_hand():
    assert Problem((37, 8, 12), ("+", "*")).value == 133  # * first: 37 + 96
    assert Problem((37, 8, 12), ("*", "-")).value == 284  # 296 - 12
    assert Problem((5, 9, 2), ("-", "-")).value == -6  # left to right
    assert Problem((3, 4, 5, 6), ("*", "+", "*")).value == 42
    assert Problem((37, 8, 12), ("+", "*")).expression == "37 + 8 * 12"


def test_problem_values_match_python_on_many_draws():
    for problem in generate_problems(200, digits=2, num_operands=4, operators="+-*", seed=1):
        assert problem.value == eval(problem.expression)  # noqa: S307 - our own digits and operators


def test_arithmetic_is_deterministic_and_splits_are_disjoint(tmp_path):
    options = dict(train_size=50, val_size=20, digits=2, num_operands=3, operators="+-", seed=4)
    train, test = prepare("arithmetic", tmp_path / "a", **options)
    again, _ = prepare("arithmetic", tmp_path / "b", **options)
    other, _ = prepare("arithmetic", tmp_path / "c", **(options | {"seed": 5}))
    assert (train.name, test.name) == ("train.parquet", "test.parquet")
    assert _rows(train) == _rows(again) and _rows(train) != _rows(other)
    train_rows, test_rows = _rows(train), _rows(test)
    assert len(train_rows) == 50 and len(test_rows) == 20
    expressions = [r["extra_info"]["expression"] for r in train_rows + test_rows]
    assert len(set(expressions)) == 70  # distinct within and across the splits
    for row in train_rows + test_rows:
        expression = row["extra_info"]["expression"]
        operands = expression.split()[::2]
        assert len(operands) == 3 and all(10 <= int(x) <= 99 for x in operands)
        assert set(expression.split()[1::2]) <= {"+", "-"}
        assert row["reward_model"]["ground_truth"] == str(eval(expression))  # noqa: S307
        assert row["data_source"] == "arithmetic" and expression in row["prompt"][0]["content"]
        assert "####" in row["prompt"][0]["content"]
    assert {r["extra_info"]["split"] for r in test_rows} == {"test"}
    # a training row's reference answer (algorithm.guidance) is right by the run's own score function; held-out rows have none
    from posttrain.rewards.arithmetic import compute_score
    for row in train_rows:
        reference = row["extra_info"]["reference_answer"]
        assert reference.endswith(f"#### {row['reward_model']['ground_truth']}")
        assert compute_score(reference, row["reward_model"]["ground_truth"])["score"] == 1.0
    assert not any(r["extra_info"].get("reference_answer") for r in test_rows)


def test_arithmetic_refuses_more_problems_than_exist(tmp_path):
    # one digit, two operands, one operator: 10 * 10 = 100 problems
    with pytest.raises(ValueError, match="only 100 exist"):
        prepare("arithmetic", tmp_path, train_size=90, val_size=11, digits=1, operators="+")
    with pytest.raises(ValueError, match="operators='/'"):
        prepare("arithmetic", tmp_path, operators="/")
    train, test = prepare("arithmetic", tmp_path, train_size=90, val_size=10, digits=1, operators="+")
    assert len(_rows(train)) + len(_rows(test)) == 100  # the whole space, still without repeats


def test_gsm8k_final_answer_by_hand():
    assert final_answer("Natalia sold 48+24 = 72 clips.\n#### 72") == "72"
    assert final_answer("...\n#### 1,080") == "1080"
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        final_answer("no marker here")


def test_gsm8k_rows_parse_and_ground_truths_match(tmp_path):
    train, test = prepare("gsm8k", tmp_path, limit=30)
    originals = [json.loads(line) for line in (VENDORED_DIR / "train.jsonl").read_text().splitlines()[:30]]
    rows = read_rows([train])  # through the dataset's own reader: the format round-trips
    assert len(rows) == 30 and len(read_rows([test])) == 30
    for row, original in zip(rows, originals):
        assert row.data_source == "openai/gsm8k" and row.ability == "math"
        assert row.messages == [{"role": "user", "content": f"{original['question']} {INSTRUCTION}"}]
        assert row.ground_truth == original["answer"].split("####")[-1].strip().replace(",", "")
        assert row.extra_info["split"] == "train" and row.extra_info["answer"] == original["answer"]
    assert rows[0].ground_truth == "72"  # Natalia's clips: 48 + 24
    assert [r.extra_info["index"] for r in rows] == list(range(30))


def test_gsm8k_vendored_copy_is_complete():
    assert (VENDORED_DIR / "LICENSE").read_text().startswith("MIT License")
    lines = {split: (VENDORED_DIR / f"{split}.jsonl").read_text().splitlines() for split in ("train", "test")}
    assert (len(lines["train"]), len(lines["test"])) == (7473, 1319)


def test_gsm8k_comes_from_the_hub_cache_when_there_else_the_vendored_copy(tmp_path):
    """With HF_HUB_OFFLINE=1: a hand-filled dataset cache is used (and said so); an empty one falls back."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "datasets--openai--gsm8k"
    for split in ("train", "test"):
        target = repo / "snapshots" / revision / "main" / f"{split}-00000-of-00001.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"question": [f"From the Hub: {split}?"], "answer": ["Work.\n#### 1,234"]}), target)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    code = "import sys; from posttrain.data import prepare, read_rows; print(read_rows([prepare('gsm8k', sys.argv[1])[0]])[0].ground_truth)"

    def run(cache):
        return subprocess.run([sys.executable, "-c", code, str(tmp_path / f"out-{cache.name}")], capture_output=True, text=True,
                              timeout=120, env=os.environ | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})

    cached = run(tmp_path / "hub")
    assert cached.returncode == 0, cached.stderr[-2000:]
    assert cached.stdout.strip() == "1234" and "GSM8K train from the Hugging Face Hub" in cached.stderr
    empty = run(tmp_path / "empty")
    assert empty.returncode == 0, empty.stderr[-2000:]
    assert "GSM8K train from the copy vendored in posttrain" in empty.stderr
    assert empty.stdout.strip() == final_answer(json.loads((VENDORED_DIR / "train.jsonl").read_text().splitlines()[0])["answer"])


@pytest.mark.parametrize("name, option, message", [
    ("arithmetic", "train_size=0", "train_size=0: must be at least 1; pass train_size=N with N >= 1"),
    ("arithmetic", "val_size=-3", "val_size=-3: must be at least 1"),
    ("gsm8k", "limit=0", "limit=0: must be at least 1"),
    ("synthetic-search", "num_places=0", "num_places=0: must be at least 1"),
    ("synthetic-search", "sft_topk=0", "sft_topk=0: must be at least 1"),
    ("synthetic-search", "sft_size=-1", "sft_size=-1: must be at least 0 (0 writes none)"),
    ("synthetic-doctor", "val_size=-1", "val_size=-1: must be at least 1"),
    ("synthetic-doctor", "patient_sft_size=-2", "patient_sft_size=-2: must be at least 0"),
])
def test_prepare_refuses_sizes_below_their_minimum_writing_nothing(tmp_path, capsys, name, option, message):
    assert main(["prepare", name, "--out", str(tmp_path / "out"), option]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"posttrain: {message}") and "Traceback" not in error
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError) as info:  # the config check's refusal is the same, without preparing
        check_options(name, parse_options(name, [option]))
    assert str(info.value).startswith(message)


def test_prepare_refuses_an_out_that_is_a_file_or_lies_under_one(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err == (
        f"posttrain: --out {tmp_path / 'notes.txt'} is a file; pass --out a directory (it is created if missing)\n")
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "notes.txt" / "data")]) == 2
    assert f"lies under {tmp_path / 'notes.txt'}, which is a file" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_prepare_refuses_an_out_under_a_read_only_directory(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes through any mode bits: stand in for the kernel's answer
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    assert main(["prepare", "arithmetic", "--out", str(locked / "data")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"posttrain: --out {locked / 'data'}: {locked} is not writable by this user; pass --out a directory")
    assert list(locked.iterdir()) == []
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "fresh" / "data"), "train_size=4", "val_size=2"]) == 0
    assert (tmp_path / "fresh" / "data" / "train.parquet").is_file()  # a directory that does not exist yet is fine
