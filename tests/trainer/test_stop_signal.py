"""How a run hears a person's stop (trainer/stopping.py's StopSignal), on real signals to this process."""

import os
import signal

import pytest

from posttrain.trainer.stopping import StopSignal, Stopped


def test_the_first_ctrl_c_is_noticed_at_the_next_clean_point_and_a_second_stops_at_once(tmp_path):
    stop = StopSignal(tmp_path)
    before = signal.getsignal(signal.SIGINT)  # the default, or what an earlier test in this process left
    with stop.installed():
        stop.check(3)  # nothing asked yet
        os.kill(os.getpid(), signal.SIGINT)  # returns: the step in progress goes on
        with pytest.raises(Stopped) as noticed:
            stop.check(3)
        assert (noticed.value.reason, noticed.value.step, noticed.value.at_once) == ("Ctrl-C", 3, False)
        # the second: a KeyboardInterrupt where it lands (what Ray's waits pass on intact), raised as the
        # stop it stands for by the nearest as_stopped()
        with pytest.raises(Stopped) as second, stop.as_stopped():
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            raise KeyboardInterrupt  # as Ray raises it again, without the original
        assert second.value.at_once and second.value.reason == "Ctrl-C again"
        with pytest.raises(KeyboardInterrupt), stop.as_stopped():  # one from elsewhere stays what it is
            raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is before  # the handler restored


def test_during_a_validation_the_first_signal_stops_at_once(tmp_path):
    stop = StopSignal(tmp_path)
    with stop.installed(), pytest.raises(Stopped) as stopped, stop.interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.reason == "SIGTERM" and not stopped.value.at_once  # a checkpoint follows (not "at once")


def test_the_stop_file_stops_at_the_next_clean_point(tmp_path):
    stop = StopSignal(tmp_path)
    stop.check(1)
    (tmp_path / "STOP").touch()
    with pytest.raises(Stopped, match="STOP exists"):
        stop.check(1)


def test_once_the_run_is_finishing_signals_are_ignored(tmp_path):
    stop = StopSignal(tmp_path)
    stop.finishing = True
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        stop.check(1)  # nothing was asked: the run is already on its way out
