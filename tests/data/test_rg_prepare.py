"""`posttrain prepare reasoning-gym`: the library's own items, train and held-out splits from different
seeds with no question shared, rows that regenerate exactly, and options refused with their fix."""

import inspect
import json
from pathlib import Path

import pytest
from tests.optional import require

require("reasoning_gym", 'reasoning-gym is installed by scripts/setup.sh (pip install -e ".[envs]")')

import pyarrow.parquet as pq  # noqa: E402
import reasoning_gym  # noqa: E402
from reasoning_gym.utils import SYSTEM_PROMPTS  # noqa: E402

from posttrain.config import load_config, preset_path  # noqa: E402
from posttrain.data.preparers import parse_options, prepare  # noqa: E402
from posttrain.data.preparers.reasoning_gym import parse_configs, prepare_reasoning_gym  # noqa: E402
from posttrain.errors import InputError  # noqa: E402
from posttrain.rewards import score_function_for  # noqa: E402

# easy enough that the training split asks many of the questions the held-out seed draws
CONFIGS = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "spell_backward": {"max_word_len": 4}}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("rg")
    options = parse_options("reasoning-gym", ["tasks=chain_sum,spell_backward", f"configs={json.dumps(CONFIGS)}", "size=60",
                                              "seed=3", "test_size=20", "test_seed=500", "system_prompt=direct", "sft_size=4", "sft_val_size=2"])
    paths = prepare("reasoning-gym", out, **options)
    assert sorted(p.name for p in paths) == ["sft.parquet", "sft_val.parquet", "test.parquet", "train.parquet"]
    return {p.stem: pq.read_table(p).to_pylist() for p in paths}


def _reference(row: dict) -> dict:
    return json.loads(row["reward_model"]["ground_truth"])


def test_splits_come_from_their_own_seeds_and_share_no_question(written):
    for split, seed, per_task in (("train", 3, 60), ("test", 500, 20)):
        rows = written[split]
        assert {_reference(r)["seed"] for r in rows} == {seed}
        assert {r["extra_info"]["split"] for r in rows} == {split}
        assert [r["extra_info"]["task"] for r in rows] == ["chain_sum"] * per_task + ["spell_backward"] * per_task
    train = {r["prompt"][-1]["content"] for r in written["train"]}
    test = [r["prompt"][-1]["content"] for r in written["test"]]
    assert not train & set(test) and len(set(test)) == len(test)
    # the held-out scan skipped questions the training split asks (2-term one-digit sums: 200 possible)
    assert max(r["extra_info"]["index"] for r in written["test"] if r["extra_info"]["task"] == "chain_sum") >= 20


def test_each_row_regenerates_its_item_with_the_library(written):
    datasets = {}
    for row in written["train"] + written["test"]:
        ref = _reference(row)
        key = (ref["task"], ref["seed"], ref["size"])
        if key not in datasets:
            datasets[key] = reasoning_gym.create_dataset(ref["task"], seed=ref["seed"], size=ref["size"], **ref["config"])
        item = datasets[key][ref["index"]]
        assert row["prompt"] == [{"role": "system", "content": SYSTEM_PROMPTS["direct"]}, {"role": "user", "content": item["question"]}]
        assert (row["data_source"], ref["task"], ref["config"], ref["index"]) == ("reasoning_gym", row["extra_info"]["task"], CONFIGS[ref["task"]], row["extra_info"]["index"])


def test_sft_transcripts_give_the_library_answer_in_its_tag(written):
    sft, train = written["sft"] + written["sft_val"], written["train"]
    assert len(written["sft"]) == 8 and len(written["sft_val"]) == 4
    score = score_function_for("reasoning_gym")
    for transcript in sft:
        messages = transcript["messages"]
        row = next(r for r in train if r["prompt"] == messages[:-1])
        assert messages[-1]["role"] == "assistant"
        assert score(solution_str=messages[-1]["content"], ground_truth=row["reward_model"]["ground_truth"])["score"] == 1.0


def test_training_rows_whose_question_the_warm_up_learnt_are_marked_in_sft(written):
    """``extra_info.in_sft``: true exactly where an SFT transcript (not a validation one) asks the row's
    question: the first items, and any later item repeating one's question."""
    taught = {t["messages"][-2]["content"] for t in written["sft"]}
    marks = [(r["prompt"][-1]["content"] in taught, r["extra_info"]["in_sft"]) for r in written["train"]]
    assert all(asked == marked for asked, marked in marks)
    first = [r for r in written["train"] if r["extra_info"]["index"] < 4]
    assert len(first) == 8 and all(r["extra_info"]["in_sft"] for r in first) and any(not marked for _, marked in marks)


@pytest.mark.parametrize("options, message", [
    ({"tasks": "chain_sum", "seed": 0, "size": 100, "test_seed": 50}, "overlap"),
    ({"tasks": "chain_sum", "test_seed": 10, "test_size": 100}, "overlap"),
    ({"tasks": "chain_summ"}, "has no task"),
    ({"tasks": ""}, "name at least one"),
    ({"tasks": "chain_sum", "configs": '{"chain_sum": {"max_termz": 3}}'}, "its config fields are"),
    ({"tasks": "chain_sum", "configs": '{"chain_sum": {"min_terms": 4, "max_terms": 3}}'}, "refuses config"),
    ({"tasks": "chain_sum", "configs": '{"leg_counting": {}}'}, "not among tasks"),
    ({"tasks": "chain_sum", "configs": "{bad"}, "is not JSON"),
    ({"tasks": "chain_sum", "system_prompt": "loud"}, "system prompts are"),
    ({"tasks": "chain_sum", "size": 4, "sft_size": 5}, "sft_size"),
    # one term of one digit: 10 questions, all asked by the training split
    ({"tasks": "chain_sum", "configs": '{"chain_sum": {"min_terms": 1, "max_terms": 1, "max_digits": 1}}', "size": 100, "test_size": 5}, "only 0 of 50"),
])
def test_bad_options_are_refused_before_writing(tmp_path, options, message):
    with pytest.raises(InputError, match=message):
        prepare_reasoning_gym(tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_the_preset_options_are_the_preparer_s_and_the_library_accepts_its_configs():
    options = dict(load_config([preset_path("rg_grpo")]).data.builtin_options)
    inspect.signature(prepare_reasoning_gym).bind(Path("out"), **options)
    configs = parse_configs(options["configs"], options["tasks"].split(","))
    for task, config in configs.items():
        item = reasoning_gym.create_dataset(task, seed=0, size=1, **config)[0]
        assert item["question"] and item["answer"]


def test_levels_are_the_library_s_own_curriculum_each_item_scored_at_its_level(tmp_path):
    options = parse_options("reasoning-gym", ["tasks=chain_sum", "size=6", "seed=0", "test_size=4", "test_seed=500", "levels=3"])
    train, test = (pq.read_table(p).to_pylist() for p in prepare("reasoning-gym", tmp_path, **options))
    assert [r["extra_info"]["level"] for r in train] == [0] * 6 + [1] * 6 + [2] * 6
    curriculum = reasoning_gym.factory.create_curriculum("chain_sum")
    score = score_function_for("reasoning_gym")
    for level in range(3):
        curriculum.set_global_level(level)
        expected = curriculum.generate_configuration({})
        rows = [r for r in train if r["extra_info"]["level"] == level]
        assert {_reference(r)["config"]["max_terms"] for r in rows} == {expected.max_terms}  # the library's level, item by item
        assert {_reference(r)["seed"] for r in rows} == {level * 6}
        item = reasoning_gym.create_dataset("chain_sum", seed=level * 6, size=6, **_reference(rows[0])["config"])[0]
        assert score(f"<answer>{item['answer']}</answer>", rows[0]["reward_model"]["ground_truth"])["acc"] == 1.0
    assert "level" not in test[0]["extra_info"] and _reference(test[0])["config"] == {}  # the held-out split as before
    with pytest.raises(InputError, match="only 11 distinct configs"):
        prepare("reasoning-gym", tmp_path / "more", **parse_options("reasoning-gym", ["tasks=chain_sum", "size=2", "test_size=2", "levels=12"]))


WORKED_CONFIGS = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
                         "allow_parentheses": False, "allow_negation": True},
    "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2, "allow_negation": True},
    "leg_counting": {"min_animals": 1, "max_animals": 3, "min_instances": 1, "max_instances": 4},
    "spell_backward": {"min_word_len": 3, "max_word_len": 8},
}


def test_worked_transcripts_show_steps_that_reach_the_library_answer(tmp_path):
    """``sft_solution=worked``: one step a line before the tag, each line's arithmetic true, the last step's
    result the library's answer (which its own scorer accepts), the same questions as ``answer`` transcripts."""
    common = {"tasks": ",".join(WORKED_CONFIGS), "configs": json.dumps(WORKED_CONFIGS), "size": 40, "seed": 7,
              "test_size": 4, "test_seed": 9000, "system_prompt": "simple", "sft_size": 30, "sft_val_size": 5}
    prepare_reasoning_gym(tmp_path / "worked", sft_solution="worked", **common)
    prepare_reasoning_gym(tmp_path / "answer", **common)
    worked, plain = (pq.read_table(tmp_path / name / "sft.parquet").to_pylist() for name in ("worked", "answer"))
    train = pq.read_table(tmp_path / "worked" / "train.parquet").to_pylist()
    score = score_function_for("reasoning_gym")
    assert len(worked) == len(plain) == 4 * 30
    for mine, theirs in zip(worked, plain, strict=True):
        messages = mine["messages"]
        assert messages[:-1] == theirs["messages"][:-1]
        *steps, tag = messages[-1]["content"].split("\n")
        assert tag == theirs["messages"][-1]["content"] and steps
        row = next(r for r in train if r["prompt"] == messages[:-1])
        task = row["extra_info"]["task"]
        assert score(solution_str=messages[-1]["content"], ground_truth=row["reward_model"]["ground_truth"])["score"] == 1.0
        question = messages[-2]["content"]
        if task == "spell_backward":
            word = question.rsplit(": ", 1)[1]
            assert steps == [f"{word}: {' '.join(word)}", f"backward: {' '.join(word[::-1])}"]
            continue
        results = []
        for step in steps:  # "a op b = c" (or "animal: n × k legs = c") holds as arithmetic
            left, result = step.rsplit(" = ", 1)
            expression = left.split(": ", 1)[-1].replace("×", "*").replace(" legs", "")
            assert eval(expression) == int(result), step  # noqa: S307 - digits and + - * only, written by the test's preparer
            results.append((expression, int(result)))
        assert f"<answer>{results[-1][1]}</answer>" == tag  # the last step reaches the answer
        if task in ("chain_sum", "basic_arithmetic"):
            terms = question.split(": ")[-1].removeprefix("Calculate ").rstrip(" =.").split()
            assert len(steps) == len(terms) // 2  # one operation a line
            assert steps[0].startswith(" ".join(terms[:3]) + " = ")
            for (_, before), (expression, _), op, term in zip(results[:-1], results[1:], terms[3::2], terms[4::2], strict=True):
                assert expression == f"{before} {op} {term}"  # each step goes on from the one before
        if task == "leg_counting":
            kinds = question.split("you have ", 1)[1].count(",") + 1
            assert len(steps) == kinds + (kinds > 1)  # an animal a line, then the sum
            if kinds > 1:
                assert results[-1][0] == " + ".join(str(legs) for _, legs in results[:-1])


@pytest.mark.parametrize("options, message", [
    ({"tasks": "chain_sum,word_sorting", "sft_solution": "worked", "sft_size": 4}, r"no worked-solution writer for \['word_sorting'\]"),
    ({"tasks": "chain_sum", "sft_solution": "steps"}, "pass one of answer, worked"),
    ({"tasks": "basic_arithmetic", "sft_solution": "worked", "sft_size": 4}, r"'operators': \('\+', '-', '\*', '/'\), 'allow_parentheses': True"),
    ({"tasks": "chain_sum", "sft_solution": "worked", "sft_size": 4, "configs": '{"chain_sum": {"min_terms": 1}}'}, "'min_terms': 1"),
])
def test_worked_solutions_refuse_what_they_cannot_write(tmp_path, options, message):
    with pytest.raises(InputError, match=message):
        prepare_reasoning_gym(tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()
