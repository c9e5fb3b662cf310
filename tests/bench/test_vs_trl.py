"""bench/vs_trl.py's checks of the TRL Python, its step times, and the driver's reward."""

import importlib.util
import os
import subprocess
import sys

import pytest

from bench.vs_trl import DRIVER, TRL_PYTHON_ENV, check_trl_python, step_times


def test_no_trl_python_names_the_flag_the_variable_and_the_recipe():
    with pytest.raises(SystemExit, match=rf"--trl-python PATH or set {TRL_PYTHON_ENV}=PATH .*Comparing with TRL"):
        check_trl_python(None)


def test_a_missing_python_is_named():
    with pytest.raises(SystemExit, match="--trl-python /nonexistent/python: no such executable"):
        check_trl_python("/nonexistent/python")


@pytest.mark.may_skip
@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="this Python has TRL")
def test_a_python_without_trl_is_refused():
    with pytest.raises(SystemExit, match="cannot import trl, torch and transformers.*install TRL there"):
        check_trl_python(sys.executable)


def test_step_times_run_from_the_end_of_the_step_before():
    assert step_times([100.0, 115.0, 135.0, 160.0]) == [15.0, 20.0, 25.0]


@pytest.mark.may_skip
@pytest.mark.skipif(not os.environ.get(TRL_PYTHON_ENV), reason=f"no TRL Python (set {TRL_PYTHON_ENV})")
def test_the_driver_scores_a_chat_completion_with_posttrains_arithmetic_score():
    # the last number of the reply is the answer (posttrain's flexible reading): 42 is right, 41 wrong
    probe = (f"import sys; sys.path.insert(0, {str(DRIVER.parent)!r}); from trl_grpo_driver import arithmetic_reward; "
             "print(arithmetic_reward([[{'role': 'assistant', 'content': '12 + 30 = 42'}], "
             "[{'role': 'assistant', 'content': '#### 41'}]], [{'ground_truth': '42'}, {'ground_truth': '42'}]))")
    repo = str(DRIVER.parents[1])
    done = subprocess.run([os.environ[TRL_PYTHON_ENV], "-c", probe], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": repo})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[1.0, 0.0]"


def test_trls_phases_split_each_step_into_generation_scoring_and_update():
    from bench.vs_trl import Run, trl_phases

    run = Run("TRL", step_end_times=[0.0, 10.0, 22.0, 31.0], cpu_at_step_end=[0.0, 0.0, 0.0, 0.0])
    # Step 1 is warm-up; steps 2-4 took 10, 12 and 9 s, of which generate-and-score 6, 7, 5 (generation 4, 5, 3).
    phases = [{"generation": 9.0, "generate_and_score": 12.0}] + [
        {"generation": g, "generate_and_score": s} for g, s in ((4.0, 6.0), (5.0, 7.0), (3.0, 5.0))
    ]
    assert trl_phases(run, {"phases": phases}) == {"generation": 4.0, "score, advantages, logprobs": 2.0, "update": 4.0}
