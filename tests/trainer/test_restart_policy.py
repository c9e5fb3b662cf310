"""The restart policy of trainer/run.py (``fit_with_restarts``) on stand-in runs: which errors start
a new attempt, from which checkpoint, how many times, and that a stop a person asked for wins."""

from pathlib import Path

import pytest
from rich.console import Console

from posttrain.controller import WorkerDiedError
from posttrain.errors import PosttrainError
from posttrain.trainer.run import Run, fit_with_restarts
from posttrain.trainer.stopping import StopSignal, Stopped


class StandInRun:
    """What fit_with_restarts uses of a Run; ``fit`` raises the next of ``outcomes`` (None: finishes)."""

    max_restarts = 2
    will_restart = Run.will_restart

    def __init__(self, outcomes: list, stop: StopSignal, saved: Path | None = None) -> None:
        self.outcomes, self.stop, self.saved = outcomes, stop, saved
        self.restarts, self.step, self.resume_from = 0, 0, None

    def fit(self) -> None:
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome

    def restart_point(self) -> Path | None:
        return self.saved


def attempts(outcomes: list, tmp_path: Path, saved: Path | None = None):
    stop = StopSignal(tmp_path)
    built = []

    def build(signal):
        assert signal is stop  # Ctrl-C keeps working across attempts
        run = StandInRun(outcomes, signal, saved)
        built.append(run)
        return run

    return StandInRun(outcomes, stop, saved), build, built


def test_a_dead_worker_restarts_from_the_last_checkpoint_up_to_the_limit(tmp_path):
    saved = tmp_path / "checkpoints" / "global_step_4"
    first, build, built = attempts([WorkerDiedError("worker 'actor' rank 0 died"), WorkerDiedError("again"), None], tmp_path, saved)
    finished = fit_with_restarts(first, build, Console(file=open("/dev/null", "w")))
    assert finished is built[-1] and len(built) == 2
    assert [run.restarts for run in built] == [1, 2] and all(run.resume_from == saved for run in built)

    first, build, built = attempts([WorkerDiedError("one"), WorkerDiedError("two"), WorkerDiedError("three")], tmp_path, saved)
    with pytest.raises(WorkerDiedError, match=r"three This was after 2 restart\(s\), the most trainer.max_restarts=2 allows"):
        fit_with_restarts(first, build, Console(file=open("/dev/null", "w")))
    assert len(built) == 2


def test_an_error_a_restart_cannot_cure_stops_at_once(tmp_path):
    first, build, built = attempts([PosttrainError("a bad reward function")], tmp_path)
    with pytest.raises(PosttrainError, match="a bad reward function"):
        fit_with_restarts(first, build, Console(file=open("/dev/null", "w")))
    assert built == []


def test_a_stop_a_person_asked_for_is_not_overridden_by_a_restart(tmp_path):
    saved = tmp_path / "checkpoints" / "global_step_3"
    first, build, built = attempts([WorkerDiedError("died while stopping")], tmp_path, saved)
    (tmp_path / "STOP").touch()
    with pytest.raises(Stopped) as info:
        fit_with_restarts(first, build, Console(file=open("/dev/null", "w")))
    assert built == [] and info.value.checkpoint == saved and info.value.step == 3 and not info.value.at_once


def test_without_an_address_a_new_local_ray_starts_even_beside_a_ray_start_cluster(monkeypatch):
    """ray.init(address=None) joins the cluster a `ray start` on this machine recorded last (and then
    refuses num_cpus); posttrain asks for a local one, and joins only what ray_address or RAY_ADDRESS names."""
    import ray

    from posttrain.config.schema import TrainerConfig
    from posttrain.cli.train import start_ray

    calls = []

    class Context:
        address_info, dashboard_url = {}, None

    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs) or Context())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    start_ray(TrainerConfig(), None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    start_ray(TrainerConfig(), None)
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] >= 1
    assert calls[1]["address"] == "10.0.0.1:6379" and "num_cpus" not in calls[1]
