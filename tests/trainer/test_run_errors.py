"""How a failed run surfaces: one line for the errors whose message says what to do (the exit code
says whether to fix something first or to resume), the traceback kept in ``<run dir>/posttrain.log``."""

import logging

from posttrain.controller import ResourceError, WorkerDiedError, WorkerHungError
from posttrain.errors import ConfigError, InvalidSettings, PosttrainError, Problem
from posttrain.trainer.async_.mode import GeneratorsFailed
from posttrain.trainer.breakers import CircuitBreakerError
from posttrain.trainer.checkpoint import CheckpointError
from posttrain.cli.report import report_error
from posttrain.cli.train import RUN_LOG, run_log


def exit_code_of(err, capsys):
    """What the CLI shows for ``err``: its exit code, after checking the one line it printed."""
    code = report_error(err)
    assert capsys.readouterr().err == f"posttrain: {err}\n"
    return code


def test_known_errors_get_one_line_and_an_exit_code(capsys):
    assert exit_code_of(WorkerDiedError("gone"), capsys) == 1  # the run broke off: resume
    assert exit_code_of(WorkerHungError("stuck", "actor", [0], "update"), capsys) == 1
    assert exit_code_of(GeneratorsFailed("x"), capsys) == 1
    assert exit_code_of(CircuitBreakerError("x"), capsys) == 1
    assert exit_code_of(ResourceError("too big"), capsys) == 2  # fix something first
    assert exit_code_of(CheckpointError("not a checkpoint"), capsys) == 2

    class NewKind(PosttrainError):  # a new error type needs no change to the CLI
        exit_code = 2

    assert exit_code_of(NewKind("x"), capsys) == 2
    # settings that cannot work, found once the data is read (a warm-up longer than the run) or by an engine
    assert exit_code_of(ConfigError([Problem("sft.optim.warmup_steps", 10, "is more than the run's 3 steps; lower it")]), capsys) == 2
    assert exit_code_of(InvalidSettings("TrainingEngineConfig", [Problem("lr", 0.0, "must be > 0")]), capsys) == 2


def test_the_run_log_keeps_the_runs_records_and_the_traceback_that_ended_it(tmp_path, capsys):
    logger = logging.getLogger("posttrain")
    level, handlers = logger.level, list(logger.handlers)
    with run_log(tmp_path) as keep_traceback:
        logging.getLogger("posttrain.rewards.manager").info("scored 8 samples")
        logging.getLogger("posttrain.rewards.manager").warning("2 rewards timed out")
        try:
            raise WorkerHungError("worker 'actor' rank(s) [0] did not answer update()", "actor", [0], "update")
        except WorkerHungError:
            keep_traceback()
    logging.getLogger("posttrain.data").warning("after the run")  # the file is closed: not in it
    kept = (tmp_path / RUN_LOG).read_text()
    assert "INFO posttrain.rewards.manager: scored 8 samples" in kept
    assert "WARNING posttrain.rewards.manager: 2 rewards timed out" in kept
    assert "Traceback" in kept and "WorkerHungError: worker 'actor' rank(s) [0] did not answer update()" in kept
    assert "after the run" not in kept
    console = capsys.readouterr().err
    assert "2 rewards timed out" in console and "scored 8 samples" not in console  # warnings still reach the console
    assert "Traceback" not in console  # the traceback went to the file alone
    assert (logger.level, logger.handlers) == (level, handlers)


def test_every_known_error_crosses_a_process_boundary_whole():
    """Errors raised in a worker or generator reach the controller pickled: each comes back as itself,
    with its message and (for a hang) the role, ranks and method it names."""
    import pickle

    import posttrain.controller.resource_pool  # noqa: F401  (every module that defines one)
    import posttrain.trainer.async_.mode  # noqa: F401
    import posttrain.trainer.breakers  # noqa: F401
    from posttrain.controller.worker_group import WorkerHungError
    from posttrain.errors import PosttrainError

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    kinds = [kind for kind in subclasses(PosttrainError) if kind.__module__.startswith("posttrain.")]  # not tests' own
    assert len(kinds) >= 6
    problems = [Problem("lr", 0.0, "must be > 0"), Problem("top_p", 2.0, "must be in (0, 1]", source="command line")]
    for kind in kinds:
        if issubclass(kind, ConfigError):
            error = kind(problems)
        elif issubclass(kind, InvalidSettings):
            error = kind("TrainingEngineConfig", problems)
        else:
            error = kind("what happened; what to do")
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), str(back), back.exit_code) == (kind, str(error), error.exit_code)
        assert getattr(back, "problems", None) == getattr(error, "problems", None)  # still data on the other side
    hung = pickle.loads(pickle.dumps(WorkerHungError("stuck", "actor", [1], "update_actor")))
    assert (hung.role, hung.ranks, hung.method) == ("actor", [1], "update_actor")
