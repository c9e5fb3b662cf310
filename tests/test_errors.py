"""One error tree: every exception class posttrain defines is a PosttrainError (the CLI shows it as one
line with its exit code), and whether a run restarts is decided by one base, ProcessLost, through the
wrappers that carry a failure up by ``raise ... from``."""

import importlib
import inspect
import pkgutil

import pytest

import posttrain
from posttrain.agents.openenv_env import OpenEnvServerLost
from posttrain.controller import WorkerDiedError, WorkerHungError
from posttrain.errors import MissingLibraryError, PosttrainError, ProcessLost, ServiceDiedError, import_optional, is_restartable
from posttrain.trainer.async_.buffer import SchedulerClosed, UnitScheduler
from posttrain.trainer.async_.coordinator import GeneratorFailure
from posttrain.trainer.async_.mode import GeneratorFeed, GeneratorsFailed, WeightBoardLost

# Control flow inside the run skeleton, never shown to a user as an error: a person's stop (printed as
# where the run is and how to continue) and a step that found no data left (the run ends normally).
NOT_ERRORS = {"posttrain.trainer.stopping.Stopped", "posttrain.trainer.stopping.DataRanOut"}
# Bugs in posttrain's own code, never a person's input: they keep their traceback (the CLI shows it).
BUGS = {"posttrain.protocol.BatchError"}


def posttrain_exception_classes() -> list[type]:
    classes = {}
    for module in pkgutil.walk_packages(posttrain.__path__, "posttrain."):
        if module.name.rsplit(".", 1)[-1] == "__main__":
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.name:
                classes[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [cls for name, cls in sorted(classes.items()) if name not in NOT_ERRORS | BUGS]


def test_every_exception_class_of_posttrain_is_a_posttrain_error():
    classes = posttrain_exception_classes()
    assert len(classes) >= 30  # the walk found the package's errors, not nothing
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in classes if not issubclass(cls, PosttrainError)]
    assert outside == []
    assert all(cls.exit_code in (1, 2) for cls in classes)


def test_a_process_that_died_or_hung_is_restartable_through_every_wrapper():
    losses = (WorkerDiedError("worker 'env_llm' rank 0 died"), WorkerHungError("stuck"), ServiceDiedError("retriever exited"),
              WeightBoardLost("board gone"), OpenEnvServerLost("the OpenEnv server went away"))
    # every restartable error posttrain defines is here
    assert {cls for cls in posttrain_exception_classes() if issubclass(cls, ProcessLost)} - {ProcessLost} == {type(e) for e in losses}
    for lost in losses:
        assert isinstance(lost, ProcessLost) and is_restartable(lost)
        assert is_restartable(generators_failed_after(lost))
    assert not is_restartable(generators_failed_after(ValueError("a bug in a reward function")))
    assert not is_restartable(generators_failed_after(PosttrainError("a reward function that cannot load")))
    assert not is_restartable(GeneratorFailure("generator 0 died 4 times; the last: ..."))  # no cause: a restart will not cure it


def generators_failed_after(cause: BaseException) -> GeneratorsFailed:
    """What the async mode raises when a generator fails with ``cause``: the generator closes the real
    scheduler with it, the mode's wait (``GeneratorFeed._take``) turns the scheduler's SchedulerClosed
    into GeneratorsFailed, and the skeleton raises that again naming its checkpoint."""
    scheduler = UnitScheduler(units_per_batch=1, groups_per_unit=1, group_size=1, capacity_units=1, max_staleness=0,
                              total_batches=1, next_prompts=lambda: None)
    scheduler.close(GeneratorFailure.caused_by(f"generator 0 failed: {cause}", cause))
    feed = GeneratorFeed.__new__(GeneratorFeed)  # only _take is used: no generators, no Ray
    with pytest.raises(GeneratorsFailed) as raised:
        try:
            feed._take(0, None, lambda waiting: scheduler.take_batch(0, while_waiting=waiting))
        except GeneratorsFailed as failed:
            raise failed.with_checkpoint("runs/x/checkpoints/global_step_3") from failed  # as trainer/run.py does
    assert isinstance(raised.value.__cause__.__cause__, SchedulerClosed)
    return raised.value


def test_main_reports_a_known_error_as_one_line_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    cli = importlib.import_module("posttrain.cli.main")  # the package exports the function main under the same name
    from posttrain.errors import InputError

    monkeypatch.setattr(cli, "_config_command", lambda args: (_ for _ in ()).throw(InputError("data.train_files: no such file")))
    assert cli.main(["config"]) == 2
    assert capsys.readouterr().err == "posttrain: data.train_files: no such file\n"
    monkeypatch.setattr(cli, "_config_command", lambda args: {}["a bug"])
    with pytest.raises(KeyError):
        cli.main(["config"])


def test_an_optional_library_that_is_missing_says_what_needs_it_and_how_to_install_it(tmp_path, monkeypatch):
    with pytest.raises(MissingLibraryError, match=r"^env\.x needs it, and some-lib is not installed; pip install some-lib$") as caught:
        import_optional("posttrain_no_such_lib.sub", package="some-lib", needed_by="env.x needs it", hint="pip install some-lib")
    assert caught.value.exit_code == 2
    # an installed library whose own dependency is missing: that import error is shown as it is (a different fix)
    (tmp_path / "posttrain_broken_lib.py").write_text("import posttrain_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="posttrain_missing_dependency"):
        import_optional("posttrain_broken_lib", package="broken-lib", needed_by="x", hint="y")
    assert import_optional("json", package="json", needed_by="x", hint="y").dumps([1]) == "[1]"
