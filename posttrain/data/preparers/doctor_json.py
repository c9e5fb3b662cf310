"""Consultation cases from a JSON file (DoctorAgent-RL's layout), written as verl-format Parquet.

``posttrain prepare doctor --in FILE --out DIR`` reads FILE, a JSON list of case objects or JSON
lines (one object a line), and writes ``train.parquet`` and ``test.parquet`` in the layout of
agents/doctor/case.py, with ``data_source="doctor"``. A case object holds:

==============================================  =====================================================
``id`` or ``case_id``                           optional; default: the case's position in the file (0, 1, ...)
``self_report`` (or ``self-report``)            required: the patient's own words, shown to the doctor
``diagnosis``                                   required: a string, or a list ``[diagnosis, *aliases]``
``aliases``                                     optional: more names that count as right
``description`` (or ``enhanced_description``)   optional: the hidden case; default: the self-report
                                                followed by the patient's replies in the dialogue
``dialogue``                                    ``[{"role": "doctor" | "patient", "content": ...}]``;
                                                a doctor turn followed by a patient turn is one QA pair
``patient_information``                         or ``[{"doctor_question": ..., "patient_response": ...}]``
==============================================  =====================================================

The split: the cases are shuffled by ``random.Random(seed)``; ``test.parquet`` takes
``round(n * val_fraction)`` of them (at least 1) and ``train.parquet`` the rest (at least 1), each in
the file's order, so no case is in both. Every case is checked before anything is written: a file
that is missing, empty or not JSON, a case without a diagnosis or a self-report, and two cases with
one id are refused with a ``ValueError`` naming the file, the case and the field.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from posttrain.agents.doctor.case import QA, Case
from posttrain.agents.doctor.prompts import doctor_instruction
from posttrain.data.format import make_row, write_rows
from posttrain.errors import InputError, read_utf8

DATA_SOURCE = "doctor"
ABILITY = "medical-consultation"


def read_case_objects(path: Path) -> list[dict[str, Any]]:
    """The case objects of ``path``: a JSON list (or one object), or JSON lines."""
    if not path.is_file():
        raise InputError(f"{path} does not exist; pass --in FILE with a JSON list of cases or JSON lines")
    text = read_utf8(path).strip()
    if not text:
        raise InputError(f"{path} is empty; it must hold a JSON list of case objects or one case object a line")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _json_lines(path, text)
    objects = [data] if isinstance(data, dict) else data
    if not isinstance(objects, list) or not objects:
        raise InputError(f"{path} holds no cases; it must hold a JSON list of case objects or one case object a line")
    return objects


def _json_lines(path: Path, text: str) -> list[Any]:
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            objects.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InputError(f"{path} is not JSON (nor JSON lines): line {number}: {error.msg}; write a JSON list "
                             "of case objects or one case object a line") from None
    return objects


def case_from_object(item: Any, position: int, path: Path) -> Case:
    """The case in ``item`` (the ``position``-th object of ``path``); see the module docstring for its fields."""
    if not isinstance(item, dict):
        raise InputError(f"{path}: case at position {position} is {type(item).__name__}, not a JSON object")
    case_id = str(next((item[key] for key in ("id", "case_id") if item.get(key) is not None), position))
    where = f"{path}: case {case_id!r} (position {position})"
    self_report = _text(item.get("self_report", item.get("self-report")))
    if not self_report:
        raise InputError(f"{where} has no self-report: add \"self_report\", the patient's own words")
    names = _diagnoses(item, where)
    if not names:
        raise InputError(f"{where} has no diagnosis: add \"diagnosis\", a string or a list [diagnosis, *aliases]")
    qa = _qa_pairs(item, where)
    description = _text(item.get("description", item.get("enhanced_description")))
    if not description:
        description = " ".join([self_report, *(pair.answer for pair in qa)])
    return Case(case_id, self_report, description, names[0], tuple(names[1:]), qa)


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _diagnoses(item: dict[str, Any], where: str) -> list[str]:
    """``[diagnosis, *aliases]`` without blanks or repeats (a single alias may be a plain string)."""
    given = item.get("diagnosis")
    names = [given] if isinstance(given, str) else list(given) if isinstance(given, list) else []
    aliases = item.get("aliases") or []
    if isinstance(aliases, str):
        aliases = [aliases]
    if not isinstance(aliases, list):
        raise InputError(f"{where}: \"aliases\" is {aliases!r}; give a list of names (or one name as a string)")
    names += aliases
    unique: list[str] = []
    for name in map(_text, names):
        if name and name not in unique:
            unique.append(name)
    return unique


def _qa_pairs(item: dict[str, Any], where: str) -> tuple[QA, ...]:
    if "patient_information" in item:
        pairs = [(entry.get("doctor_question"), entry.get("patient_response")) for entry in _entries(item, "patient_information", where)]
    else:
        turns = [(_text(entry.get("role")).lower(), entry.get("content")) for entry in _entries(item, "dialogue", where)]
        pairs = [(asked, replied) for (role, asked), (next_role, replied) in zip(turns, turns[1:])
                 if role == "doctor" and next_role == "patient"]
    return tuple(QA(_text(q), _text(a)) for q, a in pairs if _text(q) and _text(a))


def _entries(item: dict[str, Any], field: str, where: str) -> list[dict[str, Any]]:
    entries = item.get(field) or []
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise InputError(f"{where}: \"{field}\" must be a list of JSON objects")
    return entries


def read_cases(path: Path) -> list[Case]:
    """Every case of ``path``, checked (module docstring); ids must be unique."""
    cases = [case_from_object(item, position, path) for position, item in enumerate(read_case_objects(path))]
    seen: dict[str, int] = {}
    for position, case in enumerate(cases):
        if case.case_id in seen:
            raise InputError(f"{path}: cases at positions {seen[case.case_id]} and {position} share the id {case.case_id!r}; "
                             "ids must be unique")
        seen[case.case_id] = position
    return cases


def split_cases(cases: list[Case], val_fraction: float, seed: int) -> dict[str, list[Case]]:
    """``{"train": [...], "test": [...]}``, disjoint, each in the file's order (module docstring)."""
    test_count = max(1, round(len(cases) * val_fraction))
    if len(cases) - test_count < 1:
        raise InputError(f"{len(cases)} case(s) with val_fraction={val_fraction} leave none for training; "
                         "add cases or lower val_fraction")
    order = list(range(len(cases)))
    random.Random(seed).shuffle(order)
    test = set(order[:test_count])
    return {"train": [c for i, c in enumerate(cases) if i not in test], "test": [c for i, c in enumerate(cases) if i in test]}


def checked_options(given: dict[str, Any]) -> None:
    """InputError for what prepare_doctor's arguments alone call for (also ``preparers.check_options``'s)."""
    if not 0.0 < given["val_fraction"] < 1.0:
        raise InputError(f"val_fraction={given['val_fraction']}: must lie strictly between 0 and 1, e.g. val_fraction=0.1")


def prepare_doctor(out_dir: Path, *, source_file: Path, val_fraction: float = 0.1, seed: int = 0) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` (returned) from the cases in ``source_file``."""
    checked_options(dict(locals()))
    splits = split_cases(read_cases(Path(source_file)), val_fraction, seed)
    out_dir = Path(out_dir)
    return [write_rows([case_row(case, DATA_SOURCE, split, i) for i, case in enumerate(cases)], out_dir / f"{split}.parquet")
            for split, cases in splits.items()]


def case_row(case: Case, data_source: str, split: str, index: int, **extra: Any) -> dict[str, Any]:
    """The dataset row of ``case`` (agents/doctor/case.py's layout); ``extra`` joins ``split`` and ``index`` in ``extra_info``."""
    return make_row(
        data_source=data_source,
        messages=[{"role": "user", "content": doctor_instruction(case.self_report)}],
        ground_truth=case.ground_truth(),
        ability=ABILITY,
        extra_info=case.extra_info() | {"split": split, "index": index, **extra},
    )
