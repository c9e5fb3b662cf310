"""Each tracker writes what it was given where a person would look for it."""

import io

import pytest
from rich.console import Console

from posttrain.trainer.tracking import ConsoleTracker, Tracking, read_jsonl

STEPS = [{"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "val/arith/acc/mean@1": 0.4}, {"critic/score/mean": 0.5, "actor/pg_loss": float("nan")}]


def test_jsonl_writes_one_record_per_step_and_nan_as_null(tmp_path):
    tracking = Tracking(["jsonl"], run_dir=tmp_path, project="p", experiment="e", total_steps=2)
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["metrics"]["critic/score/mean"] == 0.25
    assert records[1]["metrics"]["actor/pg_loss"] is None


def test_console_prints_a_line_per_step_when_not_a_terminal():
    out = io.StringIO()
    tracker = ConsoleTracker(total_steps=2, console=Console(file=out, force_terminal=False, width=200))
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log(metrics, step)
    tracker.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 1/2 · reward 0.25 · val acc 0.4"
    assert lines[1].startswith("step 2/2 · reward 0.5")


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking = Tracking(["tensorboard"], run_dir=tmp_path, project="p", experiment="e", total_steps=2)
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("critic/score/mean")] == [0.25, 0.5]


def test_mlflow_local_store_and_wandb_offline_record_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracking = Tracking(["mlflow", "wandb"], run_dir=tmp_path, project="p", experiment="e", total_steps=2, config={"a": {"b": 1}})
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.close()
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [m.value for m in history] == [0.25, 0.5]
    assert run.data.params["a.b"] == "1"
    assert any((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_unknown_tracker_is_named():
    with pytest.raises(ValueError, match=r"unknown tracker\(s\) \['tensorbord'\]"):
        Tracking(["tensorbord"], run_dir=None, project="p", experiment="e", total_steps=1)


def test_a_resumed_run_records_each_step_once(tmp_path):
    """Steps 1..4 were logged but the last checkpoint was step 2 (and the kill cut a line short):
    the resumed run's trackers drop steps 3 and 4, and the file and TensorBoard then hold each step
    once, with the resumed run's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = Tracking(["jsonl", "tensorboard"], run_dir=tmp_path, project="p", experiment="e", total_steps=4)
    for step in (1, 2, 3, 4):
        first.log({"critic/score/mean": step / 10}, step)
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as torn:
        torn.write('{"step": 5, "time": 1.0, "metr')
    resumed = Tracking(["jsonl", "tensorboard"], run_dir=tmp_path, project="p", experiment="e", total_steps=4, purge_step=3)
    for step in (3, 4):
        resumed.log({"critic/score/mean": step}, step)
    resumed.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["metrics"]["critic/score/mean"]) for r in records] == [(1, 0.1), (2, 0.2), (3, 3.0), (4, 4.0)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("critic/score/mean")] == [(1, 0.1), (2, 0.2), (3, 3.0), (4, 4.0)]


def test_a_fresh_start_clears_an_earlier_attempts_records(tmp_path):
    tracking = Tracking(["jsonl"], run_dir=tmp_path, project="p", experiment="e", total_steps=2)
    tracking.log({"val/arith/acc/mean@1": 0.1}, 0)
    tracking.log({"critic/score/mean": 0.5}, 1)
    tracking.close()
    again = Tracking(["jsonl"], run_dir=tmp_path, project="p", experiment="e", total_steps=2, purge_step=0)
    again.log({"val/arith/acc/mean@1": 0.2}, 0)
    again.close()
    assert [(r["step"], r["metrics"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [(0, {"val/arith/acc/mean@1": 0.2})]
