"""The synthetic-doctor preparer: the condition table's logic, cases that read back, disjoint splits, the expert."""

import re

import pyarrow.parquet as pq
import pytest

from posttrain.agents.doctor import DoctorEnv, case_from_sample
from posttrain.agents.doctor.patient import is_refusal, question_similarity
from posttrain.agents.doctor.prompts import doctor_instruction
from posttrain.agents.env import EpisodeSample
from posttrain.cli import main
from posttrain.data import describe_options, parse_options, prepare, read_rows
from posttrain.data.preparers.synthetic_doctor import (
    CLUSTERS, PATTERNS, CaseKey, build_case, cases_per_condition, conditions, expert_diagnosis,
)

SMALL = dict(train_size=96, val_size=64, seed=3)


def _sample(row) -> EpisodeSample:
    return EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info)


def _transcripts(path) -> list[list[dict[str, str]]]:
    return [row["messages"] for row in pq.read_table(path).to_pylist()]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("doctor")
    train, test = prepare("synthetic-doctor", out_dir, **SMALL)
    return read_rows([train]), read_rows([test])


def test_table_has_eight_clusters_of_four_conditions_with_unique_names():
    assert len(CLUSTERS) == 8 and all(len(c.conditions) == 4 for c in CLUSTERS) and len(conditions()) == 32
    names = [name.lower() for _, condition in conditions() for name in (condition.name, *condition.aliases)]
    assert len(names) == len(set(names))  # no name is a right answer for two conditions
    assert cases_per_condition() == 63 * 2 * 3 * 5
    for cluster in CLUSTERS:
        assert len(cluster.phrasings) == 3 and len(cluster.durations) == 5 and len(cluster.findings) == 3


def test_patterns_are_distinct_and_only_a_and_b_share_the_first_two_answers():
    assert set(PATTERNS) == {"A", "B", "C", "D"} and len(set(PATTERNS.values())) == 4
    for cluster in CLUSTERS:
        patterns = [PATTERNS[cluster.pattern(c)] for c in cluster.conditions]
        assert patterns == [PATTERNS[p] for p in "ABCD"]
        after_two: dict[tuple, list[str]] = {}
        for condition, pattern in zip(cluster.conditions, patterns):
            after_two.setdefault(pattern[:2], []).append(cluster.pattern(condition))
        assert sorted(after_two.values()) == [["A", "B"], ["C"], ["D"]]
        after_one = {pattern[:1] for pattern in patterns[:3]}
        assert after_one == {(True,)} and patterns[3][:1] == (False,)  # Q1 alone singles out D


def test_expert_diagnosis_takes_the_first_condition_that_fits():
    cluster = CLUSTERS[0]  # chest pain: pericarditis, angina, costochondritis, reflux
    assert expert_diagnosis(cluster, (True, True)).name == "pericarditis"  # A and B fit; A comes first
    assert expert_diagnosis(cluster, (True, True, False)).name == "angina"
    assert expert_diagnosis(cluster, (True, False)).name == "costochondritis"
    assert expert_diagnosis(cluster, (False,)).name == "gastro-oesophageal reflux disease"
    assert expert_diagnosis(cluster, (True,)).name == "pericarditis"


def test_findings_read_as_yes_or_no_and_questions_are_told_apart():
    for cluster in CLUSTERS:
        for finding in cluster.findings:
            assert finding.question.endswith("?")
            assert finding.yes_reply.startswith("Yes") and finding.no_reply.startswith("No")
            assert not is_refusal(finding.yes_reply) and not is_refusal(finding.no_reply)
            assert finding.yes_statement != finding.no_statement
        questions = [f.question for f in cluster.findings]
        for i, a in enumerate(questions):  # the rule patient never takes one question for another
            assert all(question_similarity(a, b) < 0.5 for b in questions[i + 1:]), (cluster.name, a)


def test_a_case_by_hand():
    cluster = CLUSTERS[0]
    angina = cluster.conditions[1]
    case = build_case(CaseKey(cluster, angina, age=45, sex="man", phrasing=0, duration=1), seed=0)
    assert case.case_id == "angina-m45-p0-d1"
    assert case.self_report == "I've had chest pain for three days."
    prefix = "A 45-year-old man. He has had chest pain for three days. "
    assert case.description.startswith(prefix)
    statements = [s + "." for s in case.description[len(prefix):].rstrip(".").split(". ")]
    assert sorted(statements) == sorted([  # B = (yes, yes, no), in a shuffled order
        "The pain gets worse with activity and movement.", "The pain spreads to the neck and shoulder.",
        "Sitting up does not ease the pain."])
    assert [qa.answer for qa in case.qa] == [
        "Yes, it gets worse when I move around or exert myself.", "Yes, it spreads to my neck and shoulder.",
        "No, sitting up does not help."]
    assert case.diagnoses == ("angina", "angina pectoris", "stable angina")


def test_rows_read_back_to_their_cases(prepared):
    train, test = prepared
    for row in train + test:
        info = row.extra_info
        assert row.data_source == "synthetic_doctor" and row.ability == "medical-consultation"
        assert row.messages == [{"role": "user", "content": doctor_instruction(info["self_report"])}]
        case = case_from_sample(_sample(row))
        cluster = next(c for c in CLUSTERS if c.name == info["cluster"])
        condition = next(c for c in cluster.conditions if c.name == info["condition"])
        _, sex_age, phrasing, duration = info["case_id"].rsplit("-", 3)  # e.g. "angina-m45-p0-d1"
        key = CaseKey(cluster, condition, int(sex_age[1:]), {"m": "man", "w": "woman"}[sex_age[0]],
                      int(phrasing[1:]), int(duration[1:]))
        assert case == build_case(key, seed=3)
        assert info["pattern"] == cluster.pattern(condition) and case.diagnosis == condition.name


def test_description_supports_every_reply_and_the_self_report_names_no_condition(prepared):
    train, test = prepared
    names = [n.lower() for _, c in conditions() for n in (c.name, *c.aliases)]
    for row in train + test:
        info = row.extra_info
        cluster = next(c for c in CLUSTERS if c.name == info["cluster"])
        present = PATTERNS[info["pattern"]]
        assert [qa["question"] for qa in info["qa"]] == [f.question for f in cluster.findings]  # the fixed order
        for finding, is_present, qa in zip(cluster.findings, present, info["qa"]):
            assert qa["answer"] == finding.reply(is_present) and finding.statement(is_present) in info["description"]
            assert finding.statement(not is_present) not in info["description"]
        assert any(info["self_report"] == p.format(duration=d) for p in cluster.phrasings for d in cluster.durations)
        assert not any(re.search(rf"\b{re.escape(name)}\b", info["self_report"].lower()) for name in names)


def test_splits_are_disjoint_and_test_is_balanced_over_conditions(prepared):
    train, test = prepared
    assert len(train) == 96 and len(test) == 64
    ids = [r.extra_info["case_id"] for r in train + test]
    assert len(set(ids)) == len(ids)  # unique within and across the splits
    reports = {(r.extra_info["self_report"], r.extra_info["description"]) for r in train}
    assert not reports & {(r.extra_info["self_report"], r.extra_info["description"]) for r in test}
    for split in (test, train):
        counts = {}
        for row in split:
            counts[row.extra_info["condition"]] = counts.get(row.extra_info["condition"], 0) + 1
        assert len(counts) == 32 and set(counts.values()) == {len(split) // 32}  # 2 and 3 per condition
    assert [r.extra_info["index"] for r in test] == list(range(64))
    assert {r.extra_info["split"] for r in train} == {"train"} and {r.extra_info["split"] for r in test} == {"test"}


def test_odd_sizes_differ_by_at_most_one_per_condition(tmp_path):
    _, test = prepare("synthetic-doctor", tmp_path, train_size=40, val_size=50)
    counts = {}
    for row in read_rows([test]):
        counts[row.extra_info["condition"]] = counts.get(row.extra_info["condition"], 0) + 1
    assert sorted(counts.values()) == [1] * 14 + [2] * 18  # 50 = 32 + 18


def test_same_arguments_give_byte_identical_files_and_test_ignores_train_size(tmp_path):
    prepare("synthetic-doctor", tmp_path / "a", **SMALL)
    prepare("synthetic-doctor", tmp_path / "b", **SMALL)
    prepare("synthetic-doctor", tmp_path / "c", **(SMALL | {"seed": 4}))
    prepare("synthetic-doctor", tmp_path / "d", **(SMALL | {"train_size": 200}))
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    assert (tmp_path / "a" / "test.parquet").read_bytes() == (tmp_path / "d" / "test.parquet").read_bytes()


def test_impossible_options_are_refused_with_the_numbers(tmp_path):
    with pytest.raises(ValueError, match="train_size=0: must be at least 1"):
        prepare("synthetic-doctor", tmp_path, train_size=0)
    with pytest.raises(ValueError, match="need 1891 cases of one condition, but each of the 32 conditions has only 1890"):
        prepare("synthetic-doctor", tmp_path, train_size=1890 * 32, val_size=1)
    with pytest.raises(ValueError, match="sft_size=90 \\+ sft_val_size=32 transcripts .* train_size=96"):
        prepare("synthetic-doctor", tmp_path, **(SMALL | {"sft_size": 90}))
    with pytest.raises(ValueError, match="sft_questions=4: a cluster has 3 questions"):
        prepare("synthetic-doctor", tmp_path, sft_size=1, sft_questions=4)
    with pytest.raises(ValueError, match=r"sft_extra_question_fraction=1.5: must lie in \[0, 1\]"):
        prepare("synthetic-doctor", tmp_path, sft_size=1, sft_extra_question_fraction=1.5)
    assert not list(tmp_path.iterdir())  # refused before anything was written


@pytest.fixture(scope="module")
def with_transcripts(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("doctor_sft")
    paths = prepare("synthetic-doctor", out_dir, train_size=400, val_size=32, seed=1, sft_size=300, sft_val_size=40)
    return out_dir, paths


def test_expert_transcripts_come_from_train_cases_only(with_transcripts):
    """sft_val holds train's first 40 cases and sft the next 300, in order (a self-report alone is shared by many
    cases, so the transcripts are matched to their cases by position); none of them is a test case."""
    out_dir, paths = with_transcripts
    assert [p.name for p in paths] == ["train.parquet", "test.parquet", "sft.parquet", "sft_val.parquet"]
    sft, sft_val = _transcripts(out_dir / "sft.parquet"), _transcripts(out_dir / "sft_val.parquet")
    assert (len(sft), len(sft_val)) == (300, 40)
    train, test = read_rows([out_dir / "train.parquet"]), read_rows([out_dir / "test.parquet"])
    used = train[:340]
    assert [m[0] for m in sft_val + sft] == [row.messages[0] for row in used]
    test_cases = {r.extra_info["case_id"] for r in test} | {(r.extra_info["self_report"], r.extra_info["description"]) for r in test}
    assert not test_cases & ({r.extra_info["case_id"] for r in used}
                             | {(r.extra_info["self_report"], r.extra_info["description"]) for r in used})
    for messages in sft + sft_val:
        assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * ((len(messages) - 2) // 2) + ["assistant"]
        assert messages[-1]["content"].startswith("<diagnosis> ")


def test_expert_transcripts_replay_in_the_real_environment(with_transcripts):
    """Each transcript, replayed in a fresh DoctorEnv(patient="rule") on its case, gives its observations; the
    expert is right on A, C, D cases and on B cases only when it asked 3 questions."""
    out_dir, _ = with_transcripts
    train = read_rows([out_dir / "train.parquet"])
    used = train[40:340]  # sft takes the train cases after the sft_val_size first ones
    sft = _transcripts(out_dir / "sft.parquet")
    correct = three = 0
    for row, messages in zip(used, sft, strict=True):
        assert messages[0] == row.messages[0]
        env = DoctorEnv(patient="rule")
        assert env.reset(_sample(row)) == ""
        for i in range(1, len(messages) - 1, 2):
            result = env.step(messages[i]["content"])
            assert result.observation == messages[i + 1]["content"] and result.info.counts.get("relevant_questions") == 1
        final = env.step(messages[-1]["content"])
        asked = (len(messages) - 2) // 2
        assert final.done and asked in (2, 3)
        assert final.info.success == (row.extra_info["pattern"] != "B" or asked == 3)
        correct += final.info.success
        three += asked == 3
    assert 0.5 < correct / len(sft) < 1.0
    assert three == round(300 * 0.15)


def test_observations_are_the_patients_replies(with_transcripts):
    out_dir, _ = with_transcripts
    row = read_rows([out_dir / "train.parquet"])[0]  # sft_val's first transcript is train's first case
    messages = _transcripts(out_dir / "sft_val.parquet")[0]
    replies = [qa["answer"] for qa in row.extra_info["qa"]]
    asked = (len(messages) - 2) // 2
    assert [m["content"] for m in messages[2:-1:2]] == [f"Patient: {reply}" for reply in replies[:asked]]
    assert [m["content"] for m in messages[1:-1:2]] == [f"<question> {qa['question']} </question>" for qa in row.extra_info["qa"][:asked]]


def test_sft_questions_and_fraction_options(tmp_path):
    prepare("synthetic-doctor", tmp_path, train_size=64, val_size=32, sft_size=40, sft_val_size=0,
            sft_questions=3, sft_extra_question_fraction=0.0)
    assert not (tmp_path / "sft_val.parquet").exists()
    sft = _transcripts(tmp_path / "sft.parquet")
    assert all(len(m) == 8 for m in sft)  # prompt, 3 questions and replies, diagnosis
    prepare("synthetic-doctor", tmp_path, train_size=64, val_size=32, sft_size=40, sft_questions=1,
            sft_extra_question_fraction=0.0, sft_val_size=0)
    assert all(len(m) == 4 for m in _transcripts(tmp_path / "sft.parquet"))
    prepare("synthetic-doctor", tmp_path, train_size=64, val_size=32)
    assert not (tmp_path / "sft.parquet").exists()  # no stale transcripts


def test_cli_writes_the_files(tmp_path, capsys):
    assert "sft_extra_question_fraction=0.15" in describe_options("synthetic-doctor")
    assert parse_options("synthetic-doctor", ["sft_size=5", "sft_extra_question_fraction=0.5"]) == {
        "sft_size": 5, "sft_extra_question_fraction": 0.5}
    assert main(["prepare", "synthetic-doctor", "--out", str(tmp_path), "train_size=40", "val_size=32", "sft_size=8",
                 "sft_val_size=4"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.parquet", "sft_val.parquet", "test.parquet", "train.parquet"]
    assert str(tmp_path / "sft.parquet") in capsys.readouterr().out
    assert main(["prepare", "synthetic-doctor", "--in", "cases.json", "--out", str(tmp_path)]) == 2
    assert "dataset 'synthetic-doctor' reads no input file" in capsys.readouterr().err


def test_patient_transcripts_teach_the_case_answers_from_train_cases_only(tmp_path):
    from posttrain.agents.doctor import DONT_KNOW, patient_messages

    train, test, patient = prepare("synthetic-doctor", tmp_path, **SMALL, patient_sft_size=200)
    cases = {c.description: c for c in (case_from_sample(_sample(r)) for r in read_rows([train]))}
    held_out = {case_from_sample(_sample(r)).description for r in read_rows([test])}
    transcripts = _transcripts(patient)
    assert len(transcripts) == 200
    off_case = 0
    for messages in transcripts:
        description = messages[0]["content"].split("Your case:\n")[1].split("\n")[0]
        assert description not in held_out
        case = cases[description]
        question, reply = messages[-2]["content"], messages[-1]["content"]
        earlier = [(messages[i]["content"], messages[i + 1]["content"]) for i in range(1, len(messages) - 2, 2)]
        assert messages[:-1] == patient_messages(case.description, earlier, question)  # the Env-LLM's own prompt
        answers = {pair.question: pair.answer for pair in case.qa}
        assert all(answers[q] == a for q, a in earlier)
        if question in answers:
            assert reply == answers[question]
        else:
            off_case += 1
            assert reply == DONT_KNOW
    assert 0.1 < off_case / 200 < 0.3
