"""The built-in search recipe (base → SFT → RL) with stand-in stages, in seconds: the RL stage trains
the SFT stage's export (or the model ``--use`` gives), a finished stage is skipped when the recipe
runs again and the unfinished one runs, a failed or stopped stage says which stage, where its log is
and how to continue, and the closing table's numbers, difference and per-hops columns are the ones a
person computes by hand.

Each stage is a real subprocess, as in a real recipe: ``sys.executable`` is swapped for a stand-in of
``python -m posttrain.cli COMMAND ...`` that records its arguments, writes what the stage would (an
SFT export, an eval's episodes) and fails or stops where ``STANDIN_<STAGE>`` says."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.cli.main import main
from posttrain.recipes import DONE, RecipeError, load_recipe, run_recipe, stage_argv
from tests.trainer.test_intervals import write_episodes

PYTHON = sys.executable  # the stand-in takes its place in the tests

STANDIN = '''#!{python}
import json, os, shutil, sys, time
from pathlib import Path

args = sys.argv[3:]  # after "-m posttrain.cli"
command = args[0]
if command == "export":  # its stage directory holds the model it writes
    directory = Path(args[args.index("--out") + 1]).parent
else:
    directory = Path(next(a for a in args if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
with open(os.environ["STANDIN_CALLS"], "a") as calls:
    calls.write(json.dumps([directory.name, *args]) + "\\n")
print(f"stand-in posttrain {{command}} in {{directory}}", flush=True)
what = os.environ.get("STANDIN_" + directory.name.upper(), "")
if what == "fail":
    print("ValueError: the stand-in failed", flush=True)
    sys.exit(1)
if what == "stop":  # what a train stage prints after Ctrl-C, at a checkpoint
    print("posttrain: stopped (Ctrl-C) after step 1 of 60; checkpoint x. To continue: posttrain train ...", flush=True)
    sys.exit(0)
if what == "interrupted":  # an eval stage's Ctrl-C, or a train stage's second one
    print("posttrain: interrupted", flush=True)
    sys.exit(130)
if what == "wait-for-ctrl-c":
    (directory / "waiting").touch()
    try:
        time.sleep(20)
    except KeyboardInterrupt:
        print("posttrain: stopped (Ctrl-C) after step 1 of 60; checkpoint x. To continue: posttrain train ...", flush=True)
        sys.exit(0)
    print("no Ctrl-C reached the stage", flush=True)
    sys.exit(1)
if command in ("sft", "export"):
    (directory / "export").mkdir(exist_ok=True)
if command == "eval":
    shutil.copy(Path(os.environ["STANDIN_EPISODES"]) / f"{{directory.name}}.jsonl", args[args.index("--dump-episodes") + 1])
'''

HOPS = [1] * 5 + [2] * 5
# items 0-4 single-hop, 5-9 two-hop: SFT gets the single-hop ones; RL the two-hop ones and all single-hop but item 0
SUCCESSES = {"base_eval": [False] * 10, "sft_eval": [True] * 5 + [False] * 5, "rl_eval": [False] + [True] * 9}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The stand-in stages; returns a function that reads the calls made so far as {stage: argv}."""
    script = tmp_path / "standin.py"
    script.write_text(STANDIN.format(python=sys.executable))
    script.chmod(0o755)
    episodes = tmp_path / "episodes"
    episodes.mkdir()
    for stage, successes in SUCCESSES.items():
        write_episodes(episodes / f"{stage}.jsonl", successes, HOPS)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STANDIN_CALLS", str(calls))
    monkeypatch.setenv("STANDIN_EPISODES", str(episodes))
    monkeypatch.setattr(sys, "executable", str(script))

    def read_calls() -> dict[str, list[str]]:
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return {call[0]: call[1:] for call in map(json.loads, lines)}

    return read_calls


def test_the_rl_stage_trains_the_sft_export_and_a_given_sft_stage_is_not_run(tmp_path, stand_in):
    root = tmp_path / "runs"
    # a base model for every stage: the stages before SFT use it, the ones after use the SFT export
    assert run_recipe("search", ["actor_rollout_ref.model.path=/models/base"], root) == 0
    calls = stand_in()
    assert list(calls) == ["base_eval", "sft", "sft_eval", "rl", "rl_eval"]
    export = f"actor_rollout_ref.model.path={root / 'sft' / 'export'}"

    def model_paths(stage: str) -> list[str]:  # the last one is the one the stage's config takes
        return [a for a in calls[stage] if a.startswith("actor_rollout_ref.model.path=")]

    assert model_paths("base_eval")[-1] == model_paths("sft")[-1] == "actor_rollout_ref.model.path=/models/base"
    assert model_paths("sft_eval")[-1] == export and model_paths("rl")[-1] == export
    assert calls["rl"][:3] == ["train", "--preset", "search_grpo"]
    assert calls["rl_eval"][calls["rl_eval"].index("--checkpoint") + 1] == str(root / "rl")

    # --use sft=PATH: the SFT stage does not run, the later stages take PATH
    patient = tmp_path / "sft_made_before"
    patient.mkdir()
    other = tmp_path / "other_runs"
    assert run_recipe("search", [], other, [f"sft={patient}"]) == 0
    calls = stand_in()
    assert list(calls) == ["base_eval", "sft_eval", "rl", "rl_eval"] and not (other / "sft").exists()
    assert model_paths("rl")[-1] == model_paths("sft_eval")[-1] == f"actor_rollout_ref.model.path={patient}"
    assert f"| sft | given: {patient} |" in (other / "report.md").read_text()


SEEDS = """
description: two seeds and the mean of their final policies
stages:
  - {name: rl, command: train, preset: search_grpo}
  - {name: rl_seed2, command: train, preset: search_grpo, overrides: [trainer.seed=2]}
  - {name: mean, command: export, checkpoint: rl, options: [--with, "{stage:rl_seed2}"]}
  - {name: rl_eval, command: eval, preset: search_grpo, inputs: {actor_rollout_ref.model.path: mean}}
"""


def test_an_export_stage_writes_the_mean_of_two_seeds_that_the_next_stage_evaluates(tmp_path, stand_in):
    """The export stage runs posttrain export on the train stage it names, with its options (another seed's run
    in the mean), and no config override; the stage after it takes the model it wrote."""
    recipe = tmp_path / "seeds.yaml"
    recipe.write_text(SEEDS)
    root = tmp_path / "runs"
    assert run_recipe(str(recipe), ["actor_rollout_ref.model.path=/models/sft"], root) == 0
    calls = stand_in()
    assert list(calls) == ["rl", "rl_seed2", "mean", "rl_eval"]
    assert calls["mean"] == ["export", str(root / "rl"), "--out", str(root / "mean" / "export"), "--with", str(root / "rl_seed2")]
    assert [a for a in calls["rl_eval"] if a.startswith("actor_rollout_ref.model.path=")][-1] == (
        f"actor_rollout_ref.model.path={root / 'mean' / 'export'}")
    assert run_recipe(str(recipe), ["actor_rollout_ref.model.path=/models/sft"], root) == 0
    assert stand_in() == {}  # finished: skipped


def test_a_given_evaluation_is_reused_only_if_it_ran_the_command_this_recipe_would(tmp_path, stand_in, monkeypatch):
    """--use base_eval=OLD/base_eval: the base model's evaluation of an earlier run (made under a relative
    --dir) is not run again and is the table's base row, in --report too; with another override for every
    stage its command differs, and it is refused, as is one whose DONE records no command."""
    monkeypatch.chdir(tmp_path)
    old, new = tmp_path / "old", tmp_path / "new"
    assert run_recipe("search", [], Path("old")) == 0
    stand_in()
    assert run_recipe("search", [], new, [f"base_eval={old / 'base_eval'}"]) == 0
    assert list(stand_in()) == ["sft", "sft_eval", "rl", "rl_eval"] and not (new / "base_eval").exists()
    report = (new / "report.md").read_text()
    assert "| base | 0.000 [0.000, 0.278] (n=10) |" in report and f"| base_eval | given: {old / 'base_eval'} (ran in " in report
    assert run_recipe("search", [], new, [f"base_eval={old / 'base_eval'}"], report_only=True) == 0
    assert "| base | 0.000 [0.000, 0.278] (n=10) |" in (new / "report.md").read_text()
    with pytest.raises(RecipeError) as info:
        run_recipe("search", ["trainer.seed=3"], tmp_path / "other", [f"base_eval={old / 'base_eval'}"])
    assert "that evaluation ran another command" in str(info.value) and "trainer.seed=3" in str(info.value)
    assert stand_in() == {}  # refused before any stage ran
    unsaid = shutil.copytree(old / "base_eval", tmp_path / "unsaid")  # a DONE that records no command (hand-written, or older)
    (unsaid / DONE).write_text(json.dumps({k: v for k, v in json.loads((unsaid / DONE).read_text()).items() if k != "command"}))
    with pytest.raises(RecipeError, match=f"base_eval={unsaid}: its DONE records no command.*Leave --use base_eval= out"):
        run_recipe("search", [], tmp_path / "older", [f"base_eval={unsaid}"])
    # every stage given: the table alone, from the old run's evaluations; the sft stage given as its export (the model
    # the later stages took), timed by the stage that wrote it
    given = [f"{name}={old / name}" for name in ("base_eval", "sft_eval", "rl", "rl_eval")] + [f"sft={old / 'sft' / 'export'}"]
    assert run_recipe("search", [], tmp_path / "table", given) == 0
    table = (tmp_path / "table" / "report.md").read_text()
    assert stand_in() == {} and "| RL − SFT | +0.400" in table and "| all | 0.0 min |" not in table  # no stage ran: no total
    assert f"| sft | given: {old / 'sft' / 'export'} (ran in " in table


def test_a_stage_override_reaches_a_prepare_stage_and_wins_over_an_input(tmp_path):
    doctor = load_recipe("doctor")
    stages = {stage.name: stage for stage in doctor.stages}
    dirs = {name: tmp_path / name for name in stages}
    prepare = stage_argv(stages["patient_data"], dirs["patient_data"], dirs, [], ["train_size=10"])
    assert prepare[-1] == "train_size=10"
    rl = stage_argv(stages["rl"], dirs["rl"], dirs, ["env.llm.model_path=/every/stage"], ["env.llm.model_path=/rl/only"])
    assert [a for a in rl if a.startswith("env.llm.model_path=")] == [
        "env.llm.model_path=/every/stage", f"env.llm.model_path={dirs['patient']}", "env.llm.model_path=/rl/only"]


def test_a_recipe_run_again_skips_the_finished_stages_and_runs_the_one_that_failed(tmp_path, stand_in, monkeypatch, capsys):
    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_RL", "fail")
    with pytest.raises(RecipeError):
        run_recipe("search", [], root)
    assert list(stand_in()) == ["base_eval", "sft", "sft_eval", "rl"]
    assert (root / "rl" / "STARTED").is_file() and not (root / "rl" / "DONE").exists()

    monkeypatch.delenv("STANDIN_RL")
    capsys.readouterr()
    assert run_recipe("search", [], root) == 0
    assert list(stand_in()) == ["rl", "rl_eval"]
    out = capsys.readouterr().out
    for number, stage in ((1, "base_eval"), (2, "sft"), (3, "sft_eval")):
        assert f"stage {number}/5 {stage}: done before, skipped ({root / stage})" in out

    assert run_recipe("search", [], root) == 0
    assert stand_in() == {} and capsys.readouterr().out.count("done before, skipped") == 5
    # a changed SFT stage runs again, and every stage after it; the one before stays skipped
    assert run_recipe("search", ["sft:sft.total_epochs=2"], root) == 0
    assert list(stand_in()) == ["sft", "sft_eval", "rl", "rl_eval"]
    # each rerun stage's old run moved aside (a train stage must not resume the old run's checkpoints)
    assert all(len(list(root.glob(f"{stage}.before-*"))) == 1 for stage in ("sft", "sft_eval", "rl", "rl_eval"))
    assert "the previous run moved to" in capsys.readouterr().out


def test_a_train_stage_given_more_steps_trains_further_in_its_directory_and_any_other_change_starts_it_over(
        tmp_path, stand_in, capsys):
    """As with ``posttrain train``: raising the steps of a finished rl stage keeps its directory (its checkpoints:
    the run resumes from them), where a lower count, another change beside it, or a changed stage before it move
    the old run aside; the stages after it run again either way."""
    root = tmp_path / "runs"
    assert run_recipe("search", [], root) == 0 and len(stand_in()) == 5
    (root / "rl" / "checkpoint-of-step-60").touch()  # what the stand-in's run would have saved
    capsys.readouterr()

    assert run_recipe("search", ["rl:trainer.total_training_steps=80"], root) == 0
    assert list(stand_in()) == ["rl", "rl_eval"]
    assert (root / "rl" / "checkpoint-of-step-60").exists() and not list(root.glob("rl.before-*"))
    assert len(list(root.glob("rl_eval.before-*"))) == 1  # the evaluation of the longer run is a new one
    out = capsys.readouterr().out
    assert "stage rl: only its length changed (trainer.total_training_steps 60 → 80): it trains further" in out
    assert "trainer.total_training_steps=80" in json.loads((root / "rl" / "DONE").read_text())["command"]

    for arguments in (["rl:trainer.total_training_steps=70"],  # fewer steps than the run has
                      ["rl:trainer.total_training_steps=90", "rl:actor_rollout_ref.actor.optim.lr=1e-6"]):  # and another change
        assert run_recipe("search", arguments, root) == 0 and list(stand_in()) == ["rl", "rl_eval"]
        assert not (root / "rl" / "checkpoint-of-step-60").exists()
        assert "the previous run moved to" in capsys.readouterr().out
        (root / "rl" / "checkpoint-of-step-60").touch()
    # the stage before changed: start over, however many more steps (the rl stage's own settings as the last run's)
    assert run_recipe("search", ["sft:sft.total_epochs=2", "rl:trainer.total_training_steps=100",
                                 "rl:actor_rollout_ref.actor.optim.lr=1e-6"], root) == 0
    assert list(stand_in()) == ["sft", "sft_eval", "rl", "rl_eval"] and not (root / "rl" / "checkpoint-of-step-60").exists()


def test_a_failed_stage_names_itself_its_log_and_how_to_continue_and_exits_2(tmp_path, stand_in, monkeypatch, capsys):
    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_SFT", "fail")
    assert main(["recipe", "search", "--dir", str(root)]) == 2
    captured = capsys.readouterr()
    assert (f"posttrain: stage 'sft' failed (exit 1); its output is in {root / 'sft' / 'stage.log'}. Fix the cause and run the "
            "same recipe command again: finished stages are skipped, a train or sft stage resumes") in captured.err
    assert "ValueError: the stand-in failed" in (root / "sft" / "stage.log").read_text()
    assert "ValueError: the stand-in failed" in captured.out  # shown as it ran, too
    assert list(stand_in()) == ["base_eval", "sft"] and not (root / "report.md").exists()


@pytest.mark.parametrize("what, code", [("stop", 0), ("interrupted", 130)])
def test_a_stopped_stage_stops_the_recipe_with_the_command_that_continues_it(tmp_path, stand_in, monkeypatch, capsys, what, code):
    """A train stage stopped at a checkpoint exits 0 and so does the recipe; one stopped at once exits 130."""
    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_RL", what)
    monkeypatch.setattr(sys, "argv", ["posttrain", "recipe", "search", "--dir", str(root), "trainer.seed=3"])
    assert run_recipe("search", ["trainer.seed=3"], root) == code
    out = capsys.readouterr().out
    assert f"posttrain: the recipe stopped in stage 'rl'. To continue: posttrain recipe search --dir {root} trainer.seed=3" in out
    assert list(stand_in()) == ["base_eval", "sft", "sft_eval", "rl"]
    assert not (root / "rl" / "DONE").exists() and not (root / "report.md").exists()


def test_a_resumed_train_stage_reports_the_time_of_all_its_runs_and_a_rerun_evaluation_its_last(
        tmp_path, stand_in, monkeypatch):
    """A train stage stopped and run again goes on from its checkpoints: its wall time is both runs'; an eval stage
    that failed starts over, so only its last run counts. Each stopped or failed run here is made to have taken 10
    minutes (its STARTED record's start moved back); its log's time, as a copy may leave it, does not count where the
    run recorded its end."""
    def took_ten_minutes(stage: str) -> None:
        started = root / stage / "STARTED"
        record = json.loads(started.read_text())
        record["began"] = record["ended"] - 600
        started.write_text(json.dumps(record))
        os.utime(root / stage / "stage.log", (record["ended"] + 3600,) * 2)  # as a copy that did not keep the files' times

    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_RL", "stop")
    assert run_recipe("search", [], root) == 0
    took_ten_minutes("rl")
    monkeypatch.delenv("STANDIN_RL")
    monkeypatch.setenv("STANDIN_RL_EVAL", "fail")
    with pytest.raises(RecipeError):
        run_recipe("search", [], root)
    took_ten_minutes("rl_eval")
    monkeypatch.delenv("STANDIN_RL_EVAL")
    assert run_recipe("search", [], root) == 0
    done = json.loads((root / "rl" / DONE).read_text())
    assert done["runs"] == 2 and 600 <= done["seconds"] < 660
    assert json.loads((root / "rl_eval" / DONE).read_text())["seconds"] < 60
    times = dict(line.strip("| ").split(" | ") for line in (root / "report.md").read_text().splitlines() if line.startswith("| rl"))
    assert times["rl"].startswith("10.") and times["rl"].endswith(" min, in 2 runs (resumed)")
    assert times["rl_eval"] == "0.0 min"


@pytest.mark.parametrize("older_recipe", [False, True])
def test_a_train_stage_killed_outright_counts_its_run_to_its_log_s_last_line(tmp_path, stand_in, monkeypatch, older_recipe):
    """A run killed outright records no end: it ends at its log's last line. A STARTED written by an older recipe
    has no start either: the run starts at that file's time (the rl stage of a recipe updated while it was stopped)."""
    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_RL", "stop")
    assert run_recipe("search", [], root) == 0
    started, now = root / "rl" / "STARTED", time.time()
    record = {key: value for key, value in json.loads(started.read_text()).items() if key != "ended"} | {"began": now - 300}
    if older_recipe:
        record = {key: record[key] for key in ("fingerprint", "command")}
    started.write_text(json.dumps(record))
    os.utime(started, (now - 300,) * 2)
    os.utime(root / "rl" / "stage.log", (now,) * 2)
    monkeypatch.delenv("STANDIN_RL")
    assert run_recipe("search", [], root) == 0
    done = json.loads((root / "rl" / DONE).read_text())
    assert done["runs"] == 2 and 300 <= done["seconds"] < 360


def test_a_train_stage_trained_further_counts_the_time_of_the_run_it_goes_on_from(tmp_path, stand_in):
    root = tmp_path / "runs"
    assert run_recipe("search", [], root) == 0
    done = json.loads((root / "rl" / DONE).read_text())
    (root / "rl" / DONE).write_text(json.dumps(done | {"seconds": 600.0}))  # its 60 steps took 10 minutes
    assert run_recipe("search", ["rl:trainer.total_training_steps=80"], root) == 0
    done = json.loads((root / "rl" / DONE).read_text())
    assert done["runs"] == 2 and 600 <= done["seconds"] < 660
    # started over (another change): its own time alone
    assert run_recipe("search", ["rl:trainer.total_training_steps=90", "rl:actor_rollout_ref.actor.optim.lr=1e-6"], root) == 0
    done = json.loads((root / "rl" / DONE).read_text())
    assert done["runs"] == 1 and done["seconds"] < 60


def test_ctrl_c_reaches_the_stage_and_the_recipe_waits_for_it_to_stop(tmp_path, stand_in):
    """Ctrl-C goes to the terminal's whole process group: the stage must get it (a stage started with
    SIGINT ignored never would), and the recipe must outlive it to say how to continue."""
    root = tmp_path / "runs"
    driver = (f"import sys; sys.executable = {sys.executable!r}; sys.argv = ['posttrain', 'recipe', 'search', '--dir', {str(root)!r}]; "
              "from posttrain.cli.main import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "STANDIN_RL": "wait-for-ctrl-c"}
    recipe = subprocess.Popen([PYTHON, "-c", driver], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (root / "rl" / "waiting").exists():
            assert recipe.poll() is None and time.monotonic() < deadline, "the rl stage never started"
            time.sleep(0.1)
        os.killpg(recipe.pid, signal.SIGINT)  # as the terminal does
        out, _ = recipe.communicate(timeout=60)
    finally:
        if recipe.poll() is None:
            os.killpg(recipe.pid, signal.SIGKILL)
    assert recipe.returncode == 0, out
    assert "posttrain: stopped (Ctrl-C) after step 1 of 60" in out
    assert f"posttrain: the recipe stopped in stage 'rl'. To continue: posttrain recipe search --dir {root}" in out
    assert not (root / "rl" / "DONE").exists()


def test_the_table_has_each_row_per_hops_and_the_difference_rl_minus_sft(tmp_path, stand_in, capsys):
    """10 items, 5 single-hop and 5 two-hop: base 0/10; SFT 5/10 (the single-hop ones); RL 9/10 (all
    but single-hop item 0). Wilson 95 %: 0/5 → [0, 0.434], 4/5 → [0.376, 0.964], 5/5 → [0.566, 1],
    0/10 → [0, 0.278], 5/10 → [0.237, 0.763], 9/10 → [0.596, 0.982].

    RL − SFT per item: single-hop (−1, 0, 0, 0, 0), two-hop (+1 × 5). Two-hop: +1 on every item, so
    the interval is [+1, +1]. Single-hop: a resample's mean is −K/5 with K ~ Binomial(5, 0.2);
    P(K ≥ 4) = 0.007 < 0.025 ≤ P(K ≥ 3) = 0.058 and P(K = 0) = 0.33, so [−0.6, 0]. All: a resample's
    mean is (P − M)/10 with (P, M) the +1 and −1 items drawn (multinomial, 0.5 and 0.1);
    P(mean ≤ −0.1) = 0.020 < 0.025 ≤ P(mean ≤ 0) = 0.052 and P(mean ≤ 0.7) = 0.961 < 0.975 ≤
    P(mean ≤ 0.8) = 0.991, so [0, 0.8] (at 90 % it would be [0, 0.7])."""
    root = tmp_path / "runs"
    assert run_recipe("search", [], root) == 0
    report = (root / "report.md").read_text()
    table = report[report.index("| | all"):].splitlines()[:6]
    assert table == [
        "| | all | hops=1 | hops=2 |",
        "|---|---|---|---|",
        "| base | 0.000 [0.000, 0.278] (n=10) | 0.000 [0.000, 0.434] (n=5) | 0.000 [0.000, 0.434] (n=5) |",
        "| SFT | 0.500 [0.237, 0.763] (n=10) | 1.000 [0.566, 1.000] (n=5) | 0.000 [0.000, 0.434] (n=5) |",
        "| RL | 0.900 [0.596, 0.982] (n=10) | 0.800 [0.376, 0.964] (n=5) | 1.000 [0.566, 1.000] (n=5) |",
        "| RL − SFT | +0.400 [+0.000, +0.800] (paired) | -0.200 [-0.600, +0.000] (paired) | +1.000 [+1.000, +1.000] (paired) |",
    ]
    assert "| RL − SFT | +0.400 [+0.000, +0.800] (paired)" in capsys.readouterr().out


def test_a_table_compares_several_pairs_each_on_its_own_line(tmp_path, stand_in):
    """``compare`` as a list of pairs (a tuning recipe's configurations, each against the same warm-up):
    one paired line per pair, in order; SFT − base is +1 on the 5 single-hop items and 0 elsewhere."""
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text("""
stages:
  - {name: base_eval, command: eval}
  - {name: sft_eval, command: eval}
  - {name: rl_eval, command: eval}
table:
  rows: {base: base_eval, SFT: sft_eval, RL: rl_eval}
  compare: [[base_eval, sft_eval], [sft_eval, rl_eval]]
  by: hops
""")
    assert run_recipe(str(recipe), [], tmp_path / "runs") == 0
    lines = [line for line in (tmp_path / "runs" / "report.md").read_text().splitlines() if "(paired)" in line]
    assert [line.split(" | ")[0] for line in lines] == ["| SFT − base", "| RL − SFT"]
    assert lines[0].startswith("| SFT − base | +0.500 [") and "| +1.000 [+1.000, +1.000] (paired) | +0.000 [+0.000, +0.000] (paired) |" in lines[0]
    assert lines[1].startswith("| RL − SFT | +0.400 [+0.000, +0.800] (paired)")
    recipe.write_text(recipe.read_text().replace("[[base_eval, sft_eval], [sft_eval, rl_eval]]", "[[base_eval, sft_eval], [rl_eval]]"))
    with pytest.raises(RecipeError, match=r"compare \['rl_eval'\]: name two eval stages"):
        load_recipe(str(recipe))


def test_report_writes_the_table_of_the_finished_stages_and_runs_none(tmp_path, stand_in, monkeypatch, capsys):
    """A recipe stopped in its rl stage: ``--report`` writes base and SFT, leaves out RL and the one
    pair that needs it (RL − SFT), and runs nothing; the run after it finishes the recipe."""
    root = tmp_path / "runs"
    monkeypatch.setenv("STANDIN_RL", "stop")
    assert run_recipe("search", [], root) == 0 and not (root / "report.md").exists()
    stand_in()
    assert main(["recipe", "search", "--dir", str(root), "--report"]) == 0
    assert stand_in() == {}  # no stage ran
    out = capsys.readouterr().out
    assert "stage 4/5 rl: not finished, left out of the table" in out and "stage 5/5 rl_eval: not finished" in out
    report = (root / "report.md").read_text()
    assert "| base | 0.000 [" in report and "| SFT | 0.500 [0.237, 0.763] (n=10)" in report and "| sft_eval | " in report
    assert "| RL |" not in report and "(paired)" not in report and "| rl |" not in report
    monkeypatch.delenv("STANDIN_RL")
    assert run_recipe("search", [], root) == 0 and list(stand_in()) == ["rl", "rl_eval"]
    assert "| RL − SFT | +0.400 [" in (root / "report.md").read_text()


def test_a_stage_log_holds_each_line_while_the_stage_still_runs(tmp_path, monkeypatch):
    import threading

    from posttrain.recipes import run_stage

    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # as in a plain shell: the recipe itself makes its stages unbuffered
    log, go_on = tmp_path / "stage.log", tmp_path / "go_on"
    # the stage prints a progress line (a plain print, into a pipe), then waits (10 s at most) for it to be read from its log
    argv = [PYTHON, "-c", f"import os, time\nprint('validation: 256/1240 prompts')\nstart = time.monotonic()\n"
                          f"while not os.path.exists({str(go_on)!r}) and time.monotonic() - start < 10: time.sleep(0.05)\nprint('done')"]

    def watch() -> None:  # beside the stage: the line is read from the log while the stage waits for it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not go_on.exists():
            if log.exists() and "256/1240" in log.read_text():
                go_on.touch()
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    code = run_stage(argv, log)  # in the main thread: it sets the SIGINT handler
    watcher.join(30)
    assert code == (0, False) and log.read_text().endswith("done\n")
    assert go_on.exists() and time.monotonic() - start < 9, "the stage's first line reached its log only when the stage ended"


def test_report_without_the_use_arguments_a_recipe_ran_with_says_which_to_give(tmp_path, stand_in, capsys):
    """A recipe run with --use sft=PATH: ``--report`` without it leaves out the stages that read the given
    SFT and names the --use they ran with; with it, the whole table."""
    given = tmp_path / "sft_made_before"
    given.mkdir()
    root = tmp_path / "runs"
    assert run_recipe("search", [], root, [f"sft={given}"]) == 0
    stand_in()
    capsys.readouterr()
    assert main(["recipe", "search", "--dir", str(root), "--report"]) == 0
    assert stand_in() == {}
    out = capsys.readouterr().out
    assert f"stage 4/5 rl: finished with another command or other inputs: it ran with --use sft={given}; if that is" in out
    assert "stage 1/5 base_eval: done before, skipped" in out and "| RL |" not in (root / "report.md").read_text()
    assert main(["recipe", "search", "--dir", str(root), "--use", f"sft={given}", "--report"]) == 0
    assert stand_in() == {} and "| RL − SFT | +0.400 [" in (root / "report.md").read_text()
