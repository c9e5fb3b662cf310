"""`posttrain recipe`: recipes are checked before anything runs, overrides reach every stage or one,
and a recipe of eval → train → eval on the tiny model ends with its table, skips its finished stages
when run again and resumes the ones that were not."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.config import load_config, preset_path
from posttrain.config.mixture import mixture_sources
from posttrain.models import cached_tiny_model
from posttrain.recipes import (
    RecipeError,
    Stage,
    builtin_names,
    check_given,
    given_stamp,
    load_recipe,
    parse_given,
    run_recipe,
    split_overrides,
    unneeded_stages,
)
from tests.e2e.test_train_cli import TINY_RUN


# the measured run whose held-out figures docs/tools.md gives as the bfcl recipe's (docs/measured/<name>.txt)
BFCL_MEASURED = "bfcl_counts"


def flat(value, prefix: str = "") -> dict:
    """A config (dataclasses, dicts) as one dict of dotted keys."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_built_in_recipes_load_and_each_problem_of_a_broken_one_is_named(tmp_path):
    assert "search" in builtin_names()
    search = load_recipe("search")
    assert [s.name for s in search.stages] == ["base_eval", "sft", "sft_eval", "rl", "rl_eval"]
    assert search.rows == {"base": "base_eval", "SFT": "sft_eval", "RL": "rl_eval"}
    broken = write(tmp_path / "broken.yaml", """
stages:
  - {name: a, command: fly}
  - {name: b, command: train, inputs: {actor_rollout_ref.model.path: later}}
  - {name: c, command: eval, checkpoint: a}
  - {name: c, command: prepare}
  - {name: d, command: export, overrides: [trainer.seed=2]}
table: {rows: {x: b}, compare: [c]}
""")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(broken))
    message = str(info.value)
    for fragment in ("command 'fly' is not one of prepare, sft, train, eval", "'later', which is not an earlier stage",
                     "checkpoint 'a' must name an earlier train stage", "stage 'c' is named twice", "names its dataset",
                     "table row 'x': 'b' is not an eval stage", "compare ['c']: name two eval stages",
                     "stage 'd': an export stage names the train stage it exports (checkpoint: rl) and takes no preset"):
        assert fragment in message, fragment
    with pytest.raises(RecipeError, match="no recipe 'nope'"):
        load_recipe("nope")
    with pytest.raises(RecipeError, match="unknown key"):
        load_recipe(str(write(tmp_path / "extra.yaml", "stages: []\nstep: 3\n")))
    with pytest.raises(RecipeError, match=r"table: unknown key\(s\) \['compare_by'\]; a table has rows, compare and by, nothing else"):
        load_recipe(str(write(tmp_path / "table.yaml", "stages: [{name: a, command: eval}]\ntable: {rows: {x: a}, compare_by: x}\n")))


def test_overrides_go_to_every_stage_or_to_the_one_named():
    recipe = load_recipe("search")
    common, per_stage = split_overrides(recipe, ["trainer.seed=3", "rl:trainer.total_training_steps=5"])
    assert common == ["trainer.seed=3"] and per_stage["rl"] == ["trainer.total_training_steps=5"] and per_stage["sft"] == []
    with pytest.raises(RecipeError, match="has no stage 'rll'"):
        split_overrides(recipe, ["rll:trainer.seed=1"])
    with pytest.raises(RecipeError, match="key=value"):
        split_overrides(recipe, ["trainer.seed"])
    # an export stage runs posttrain export, which takes options, not settings: refused before any stage runs
    seeds = dataclasses.replace(recipe, stages=[*recipe.stages, Stage(name="mean", command="export", checkpoint="rl")])
    assert split_overrides(seeds, ["trainer.seed=3"])[1]["mean"] == []
    with pytest.raises(RecipeError, match="'mean:trainer.seed=2': mean is an export stage, which takes no key=value settings"):
        split_overrides(seeds, ["mean:trainer.seed=2"])


def test_a_given_stage_is_checked_and_the_stages_only_it_reads_are_not_run(tmp_path):
    doctor = load_recipe("doctor")
    patient = tmp_path / "patient_export"
    patient.mkdir()
    given = parse_given([f"patient={patient}"])
    check_given(doctor, given)
    assert unneeded_stages(doctor, given) == {"patient_data"}  # only the patient's SFT reads the patient data
    assert unneeded_stages(doctor, parse_given([f"sft={patient}"])) == set()  # sft reads no stage
    # a given rl stage leaves nothing unneeded: the eval stages read only the patient and the rl run
    assert unneeded_stages(doctor, parse_given([f"rl={patient}"])) == set()
    with pytest.raises(RecipeError) as info:
        check_given(doctor, parse_given(["sft_eval=" + str(patient), "nurse=" + str(patient), "sft=" + str(tmp_path / "missing")]))
    for fragment in (f"--use sft_eval={patient}: an eval stage is given as the directory of a finished evaluation", "has no stage 'nurse'",
                     "missing: no such file or directory"):
        assert fragment in str(info.value), fragment
    with pytest.raises(RecipeError, match="write STAGE=PATH"):
        parse_given(["patient"])
    with pytest.raises(RecipeError, match="given twice"):
        parse_given([f"patient={patient}", f"patient={tmp_path}"])
    # an override for a stage that will not run is refused before anything runs
    with pytest.raises(RecipeError, match="overrides for patient_data, which will not run"):
        run_recipe("doctor", ["patient_data:train_size=10"], tmp_path / "runs", [f"patient={patient}"])
    assert not (tmp_path / "runs").exists()
    # the fingerprint of a given output changes when it is written again; a dangling link in it (a run's
    # ray_logs once Ray stopped) is read as itself
    (patient / "ray_logs").symlink_to(tmp_path / "gone")
    stamp = given_stamp(patient)
    time.sleep(0.01)
    (patient / "model.safetensors").write_bytes(b"new")
    assert given_stamp(patient) != stamp


TINY_RECIPE = """
description: the tiny model, evaluated, trained two steps, evaluated again
stages:
  - {name: base_eval, command: eval}
  - name: rl
    command: train
    overrides: [trainer.total_training_steps=2, trainer.val_before_train=false, trainer.test_freq=-1]
  - {name: rl_eval, command: eval, checkpoint: rl}
table:
  rows: {base: base_eval, RL: rl_eval}
  compare: [base_eval, rl_eval]
"""


@pytest.mark.slow
@pytest.mark.ray
def test_a_recipe_runs_its_stages_ends_with_its_table_and_skips_what_finished(tmp_path, on_shared_ray):
    recipe = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    argv = [sys.executable, "-m", "posttrain.cli", "recipe", str(recipe), "--dir", str(tmp_path / "runs"),
            f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", *TINY_RUN, "actor_rollout_ref.rollout.name=hf",
            "rl:trainer.save_freq=1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    runs = tmp_path / "runs"
    for stage in ("base_eval", "rl", "rl_eval"):
        command = json.loads((runs / stage / "DONE").read_text())["command"]
        assert command.startswith("posttrain ") and "'trainer.logger=[console,jsonl]'" in command
        assert command in done.stdout  # printed as run: a list override is not taken for rich markup
    assert (runs / "rl" / "checkpoints" / "global_step_2").is_dir()  # the stage override reached the train stage only
    rows = [json.loads(line) for line in (runs / "rl_eval" / "episodes.jsonl").read_text().splitlines()]
    accuracy = sum(row["success"] for row in rows) / len(rows)
    report = (runs / "report.md").read_text()
    assert f"| RL | {accuracy:.3f} [" in report and "(n=4)" in report and "| RL − base | " in report and "(paired)" in report
    assert "| rl | " in report and "| all | " in report  # wall times
    assert "| RL | " in done.stdout

    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("done before, skipped") == 3

    # a changed stage starting over (its old run moved aside, not resumed) and a stage given from
    # elsewhere (--use): tests/recipes/test_recipe_stages.py, with stand-in stages


def test_the_mixture_recipe_warms_up_on_the_dataset_its_reasoning_gym_source_trains_on():
    """The sft stage runs rg_grpo with overrides; they must give the options of mixture_grpo's reasoning-gym source
    (same items, same system prompt, same transcripts' format), or the warm-up teaches another prompt than RL sees."""
    sft = next(stage for stage in load_recipe("mixture").stages if stage.name == "sft")
    warm_up = load_config([preset_path(sft.preset)], [o for o in sft.overrides if o.startswith("data.")], checks=None)
    source = next(s for s in mixture_sources(load_config([preset_path("mixture_grpo")], checks=None))
                  if s.config.data.builtin == "reasoning-gym")
    mine, theirs = dict(warm_up.data.builtin_options), dict(source.config.data.builtin_options)
    theirs.setdefault("sft_solution", "answer")
    assert (warm_up.data.builtin, mine) == (source.config.data.builtin, theirs)


def test_bfcl_rl_trains_on_the_rows_bfcl_sft_prepared_and_its_development_rows_are_the_ones_sft_never_learnt():
    """bfcl_grpo's dataset options must be bfcl_sft's: the SFT-validation questions (extra_info.in_sft false,
    what data.dev_size holds back) are drawn from those options, so other ones would validate RL on questions
    the warm-up learnt. Every data.dev_size in the two BFCL recipes is the 128 held back plus the 2 no call
    satisfies, and the sampler's shares name training categories (or the swapped rows a stage adds)."""
    from posttrain.data.preparers.bfcl import TRAIN_CATEGORIES
    from posttrain.data.preparers.bfcl_added import SWAPPED_CATEGORY

    sft, rl, multi_turn = (load_config([preset_path(name)], checks=None).data for name in ("bfcl_sft", "bfcl_grpo", "bfcl_multi_turn"))
    assert dict(rl.builtin_options) == dict(sft.builtin_options) == dict(multi_turn.builtin_options) and rl.builtin == sft.builtin == "bfcl"
    # the multi-turn recipe trains its policy (without --use rl=) as the bfcl recipe does
    rl_stages = [next(s for s in load_recipe(name).stages if s.name == "rl") for name in ("bfcl", "bfcl_multi_turn")]
    assert rl_stages[0].overrides == rl_stages[1].overrides and rl_stages[0].preset == rl_stages[1].preset
    assert rl.sampler.stratify_by == "extra_info.category" and set(rl.sampler.shares) <= set(TRAIN_CATEGORIES.split(","))
    stages = {f"{name}/{stage.name}": load_config([preset_path(stage.preset)], list(stage.overrides), checks=None).data
              for name in ("bfcl", "bfcl_tune") for stage in load_recipe(name).stages if stage.command in ("train", "eval")}
    assert all(set(data.sampler.shares) <= {*TRAIN_CATEGORIES.split(","), SWAPPED_CATEGORY} for data in stages.values())
    sizes = {stage: data.dev_size for stage, data in stages.items()}
    assert sizes["bfcl/rl"] == sft.builtin_options["sft_val_size"] + 2 and sizes["bfcl/rl_eval"] == 0  # held-out rows there
    assert {size for stage, size in sizes.items() if stage.startswith("bfcl_tune/")} == {sizes["bfcl/rl"]}



def test_the_bfcl_recipe_trains_the_configuration_whose_held_out_rows_docs_tools_reports():
    """The bfcl recipe's sft and rl stages give the very configurations of the measured run that docs/tools.md
    reports as the recipe's (its recipe file in docs/measured/recipes), but for validating before the first step
    (that run's step 0 was its warm-up's) and writing each step's kept samples (write-only); its no-call share is 0.35, split between live_irrelevance and the
    swapped rows its SFT stage also teaches (which the rl stage's data must hold), and the multi-turn recipe
    trains its policy with the very same sft and rl stages."""
    def stage_config(recipe: str, name: str):
        stage = next(s for s in load_recipe(recipe).stages if s.name == name)
        return load_config([preset_path(stage.preset)], list(stage.overrides), checks=None)

    measured = str(Path(__file__).parents[2] / "docs/measured/recipes" / f"{BFCL_MEASURED}.yaml")
    for name in ("sft", "rl"):
        mine, theirs = flat(stage_config("bfcl", name)), flat(stage_config(measured, name))
        differ = {key: (mine.get(key), theirs.get(key)) for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}
        assert set(differ) == ({"trainer.val_before_train", "trainer.rollout_data_dir"} if name == "rl" else set()), (name, differ)
    assert flat(stage_config("bfcl", "rl"))["trainer.rollout_data_dir"] == "rollouts"  # rl/rollouts: scripts/bfcl_kept.py's folder
    data, sft_data = stage_config("bfcl", "rl").data, stage_config("bfcl", "sft").data
    assert sum(data.sampler.shares.values()) == pytest.approx(0.35)
    assert set(data.sampler.shares) == {"live_irrelevance", "swapped_irrelevance"}
    assert data.builtin_options["swapped_irrelevance"] == sft_data.builtin_options["swapped_irrelevance"] > 0
    assert data.builtin_options["parallel_pairs"] == sft_data.builtin_options["parallel_pairs"] > 0
    assert "dev_swapped.parquet" in data.dev_files and data.builtin_options["dev_swapped"] > 0
    stages = [{s.name: s for s in load_recipe(name).stages} for name in ("bfcl", "bfcl_multi_turn")]
    assert all(stages[0][name].overrides == stages[1][name].overrides and stages[0][name].preset == stages[1][name].preset
               for name in ("sft", "rl"))


def test_textarena_tune_configurations_differ_from_grpo_only_where_each_says_and_share_its_games():
    """Each textarena_tune configuration trains the textarena recipe's preset for the same steps on the same rows,
    differing from its GRPO stage only in the settings it names (PPO's critic-only steps added, so the policy is
    updated as many times); every stage (evaluations too) holds back the same
    development games (same dev_size and seed) from the training seeds, so the held-out games stay unseen."""

    stages = {s.name: s for s in load_recipe("textarena_tune").stages}
    configs = {name: flat(load_config([preset_path(s.preset)], list(s.overrides), checks=None))
               for name, s in stages.items() if s.command in ("train", "eval")}
    named = {"grpo_lr": {"actor_rollout_ref.actor.optim.lr"}, "batch_norm": {"algorithm.adv_estimator"},
             "ppo": {"algorithm.adv_estimator", "trainer.total_training_steps", "trainer.critic_warmup"}}  # gamma, lam: the defaults, said
    trained = [name for name, s in stages.items() if s.command == "train"]
    assert set(trained) == {"grpo", *named} and {s.preset for s in stages.values()} == {"textarena_grpo"}
    for name in named:
        assert {key for key in configs[name] if configs[name][key] != configs["grpo"][key]} == named[name], name
        updates = configs[name]["trainer.total_training_steps"] - configs[name]["trainer.critic_warmup"]
        assert updates == configs["grpo"]["trainer.total_training_steps"] == 10, name  # the same number of policy updates
    data = {key for key in configs["grpo"] if key.startswith("data.")}
    for name, config in configs.items():
        assert config["data.dev_size"] == 64 and {k: config[k] for k in data} == {k: configs["grpo"][k] for k in data}, name
    assert all(stages[f"{name}_dev"].checkpoint == name for name in trained)
    held_out = flat(load_config([preset_path(next(s for s in load_recipe("textarena").stages if s.name == "rl_eval").preset)], checks=None))
    options = {key for key in data if key.startswith("data.builtin_options.")}
    assert options and {k: held_out[k] for k in options} == {k: configs["grpo"][k] for k in options} and held_out["data.dev_size"] == 0
