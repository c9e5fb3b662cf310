"""The doctor preparer: DoctorAgent-RL-style JSON cases in, verl-format rows out, bad input refused before writing."""

import json

import pytest

from posttrain.agents.doctor import DoctorEnv, case_from_sample
from posttrain.agents.doctor.prompts import doctor_instruction
from posttrain.agents.env import EpisodeSample
from posttrain.cli import main
from posttrain.data import describe_options, prepare, read_rows
from posttrain.data.preparers.doctor_json import read_cases

DIALOGUE_CASE = {
    "id": "mt-7",
    "self_report": "I have had a sore throat for two days.",
    "diagnosis": ["strep throat", "streptococcal pharyngitis"],
    "dialogue": [
        {"role": "doctor", "content": "Do you have a fever?"},
        {"role": "patient", "content": "Yes, about 39 degrees."},
        {"role": "doctor", "content": "Are you coughing?"},
        {"role": "patient", "content": "No, no cough."},
        {"role": "doctor", "content": "I think it is strep throat."},
    ],
}
INFORMATION_CASE = {
    "case_id": 12,
    "self-report": "My ankle hurts after I fell.",
    "diagnosis": "ankle sprain",
    "aliases": ["sprained ankle"],
    "enhanced_description": "A 30-year-old woman twisted her ankle playing football. She can walk with pain.",
    "patient_information": [{"doctor_question": "Can you walk on it?", "patient_response": "Yes, but it hurts."}],
}


def _write(path, cases, lines=False):
    text = "\n".join(json.dumps(c) for c in cases) + "\n" if lines else json.dumps(cases)
    path.write_text(text, encoding="utf-8")
    return path


def _many(count):
    return [{"id": f"c{i}", "self_report": f"Complaint {i}.", "diagnosis": f"condition {i}"} for i in range(count)]


def test_both_dialogue_layouts_become_cases(tmp_path):
    source = _write(tmp_path / "cases.json", [DIALOGUE_CASE, INFORMATION_CASE])
    dialogue, information = read_cases(source)
    assert (dialogue.case_id, dialogue.diagnosis, dialogue.aliases) == ("mt-7", "strep throat", ("streptococcal pharyngitis",))
    # consecutive doctor -> patient turns are the pairs; the closing doctor turn has no reply
    assert [(qa.question, qa.answer) for qa in dialogue.qa] == [("Do you have a fever?", "Yes, about 39 degrees."),
                                                                ("Are you coughing?", "No, no cough.")]
    assert dialogue.description == "I have had a sore throat for two days. Yes, about 39 degrees. No, no cough."
    assert (information.case_id, information.self_report) == ("12", "My ankle hurts after I fell.")
    assert information.diagnoses == ("ankle sprain", "sprained ankle")
    assert information.description == INFORMATION_CASE["enhanced_description"]
    assert [(qa.question, qa.answer) for qa in information.qa] == [("Can you walk on it?", "Yes, but it hurts.")]


def test_a_single_alias_may_be_a_string_but_not_a_number(tmp_path):
    (case,) = read_cases(_write(tmp_path / "one.json", [{"self_report": "I burn.", "diagnosis": "reflux", "aliases": "GERD"}]))
    assert case.diagnoses == ("reflux", "GERD")
    with pytest.raises(ValueError, match="case '0' .*\"aliases\" is 7"):
        read_cases(_write(tmp_path / "two.json", [{"self_report": "I burn.", "diagnosis": "reflux", "aliases": 7}]))


def test_json_lines_and_ids_by_position(tmp_path):
    cases = [{"self_report": "I feel sick.", "diagnosis": "food poisoning"}, {"self_report": "I itch.", "diagnosis": "eczema"}]
    assert [c.case_id for c in read_cases(_write(tmp_path / "cases.jsonl", cases, lines=True))] == ["0", "1"]
    assert [c.case_id for c in read_cases(_write(tmp_path / "one.json", cases[0]))] == ["0"]  # a lone object is one case


def test_rows_read_back_to_the_cases_and_play_in_the_environment(tmp_path):
    source = _write(tmp_path / "cases.json", [DIALOGUE_CASE, INFORMATION_CASE] + _many(8))
    train, test = prepare("doctor", tmp_path / "out", source_file=source)
    rows = read_rows([train, test])
    assert (len(read_rows([train])), len(read_rows([test]))) == (9, 1)  # round(10 * 0.1)
    by_id = {case.case_id: case for case in read_cases(source)}
    for row in rows:
        assert row.data_source == "doctor" and row.ability == "medical-consultation"
        case = case_from_sample(EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info))
        assert case == by_id[row.extra_info["case_id"]]
        assert row.messages == [{"role": "user", "content": doctor_instruction(case.self_report)}]
    row = next(r for r in rows if r.extra_info["case_id"] == "mt-7")
    env = DoctorEnv(patient="rule")
    env.reset(EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info))
    assert env.step("<question> Have you had a fever? </question>").observation == "Patient: Yes, about 39 degrees."
    assert env.step("<diagnosis> Streptococcal pharyngitis </diagnosis>").info.success


def test_split_is_seeded_disjoint_and_in_file_order(tmp_path):
    source = _write(tmp_path / "cases.json", _many(40))
    ids = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        train, test = prepare("doctor", tmp_path / name, source_file=source, val_fraction=0.25, seed=seed)
        ids[name] = [[r.extra_info["case_id"] for r in read_rows([path])] for path in (train, test)]
        train_ids, test_ids = ids[name]
        assert len(test_ids) == 10 and sorted(train_ids + test_ids) == sorted(f"c{i}" for i in range(40))
        assert train_ids == sorted(train_ids, key=lambda i: int(i[1:])) and test_ids == sorted(test_ids, key=lambda i: int(i[1:]))
    assert ids["a"] == ids["b"] and ids["a"] != ids["c"]
    assert (tmp_path / "a" / "train.parquet").read_bytes() == (tmp_path / "b" / "train.parquet").read_bytes()


@pytest.mark.parametrize("case, message", [
    ({"id": "x1", "diagnosis": "flu"}, r"case 'x1' \(position 1\) has no self-report: add \"self_report\""),
    ({"id": "x1", "self_report": "I ache.", "diagnosis": []}, r"case 'x1' \(position 1\) has no diagnosis"),
    ({"self_report": "I ache.", "diagnosis": "  "}, r"case '1' \(position 1\) has no diagnosis"),
    ({"id": "c0", "self_report": "I ache.", "diagnosis": "flu"}, r"positions 0 and 1 share the id 'c0'"),
    ({"self_report": "I ache.", "diagnosis": "flu", "dialogue": "hello"}, r"\"dialogue\" must be a list of JSON objects"),
    ("just a string", r"case at position 1 is str, not a JSON object"),
])
def test_bad_cases_are_refused_naming_file_case_and_field(tmp_path, case, message):
    source = _write(tmp_path / "cases.json", _many(1) + [case])
    with pytest.raises(ValueError, match=message) as refused:
        prepare("doctor", tmp_path / "out", source_file=source)
    assert str(source) in str(refused.value)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_bad_files_are_refused(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{empty} is empty"):
        prepare("doctor", tmp_path / "out", source_file=empty)
    with pytest.raises(ValueError, match="holds no cases"):
        prepare("doctor", tmp_path / "out", source_file=_write(tmp_path / "none.json", []))
    broken = tmp_path / "broken.json"
    broken.write_text('{"self_report": "I ache.", "diagnosis": "flu"}\n{"self_report": oops}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"{broken} is not JSON \\(nor JSON lines\\): line 2"):
        prepare("doctor", tmp_path / "out", source_file=broken)
    with pytest.raises(ValueError, match="missing.json does not exist; pass --in FILE"):
        prepare("doctor", tmp_path / "out", source_file=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="1 case\\(s\\) with val_fraction=0.1 leave none for training"):
        prepare("doctor", tmp_path / "out", source_file=_write(tmp_path / "one.json", _many(1)))
    with pytest.raises(ValueError, match="val_fraction=0.0: must lie strictly between 0 and 1"):
        prepare("doctor", tmp_path / "out", source_file=_write(tmp_path / "two.json", _many(2)), val_fraction=0.0)
    assert not (tmp_path / "out").exists()


def test_cli_in_option(tmp_path, capsys):
    source = _write(tmp_path / "cases.jsonl", _many(10), lines=True)
    assert describe_options("doctor") == "source_file (required), val_fraction=0.1, seed=0"
    assert main(["prepare", "doctor", "--in", str(source), "--out", str(tmp_path / "out"), "val_fraction=0.2"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "out" / "train.parquet"), str(tmp_path / "out" / "test.parquet")]
    assert len(read_rows([tmp_path / "out" / "test.parquet"])) == 2
    assert main(["prepare", "doctor", "--out", str(tmp_path / "out")]) == 2
    assert "dataset 'doctor' is read from a file: pass --in FILE" in capsys.readouterr().err
    assert main(["prepare", "doctor", "--in", str(source), "--out", str(tmp_path), f"source_file={source}"]) == 2
    assert "pass only --in FILE" in capsys.readouterr().err
    assert main(["prepare", "doctor", "--in", str(tmp_path / "nope.json"), "--out", str(tmp_path / "out")]) == 2
    assert "nope.json does not exist" in capsys.readouterr().err
