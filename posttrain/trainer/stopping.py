"""How a run stops: a person's stop (Ctrl-C, SIGTERM, ``<run dir>/STOP``), noticed at clean points
(:class:`StopSignal`), and the exceptions that end a run's loop without being a bug:
:class:`Stopped` (a person asked), :class:`DataRanOut` (no data left for a step) and
:class:`CheckpointThenStop` (an error after which the trainer's state is still sound, so it is
checkpointed first). What the skeleton does with each: ``trainer/run.py``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posttrain.errors import PosttrainError

STOP_FILE = "STOP"  # <run dir>/STOP: stop at the next clean point, as Ctrl-C does


class Stopped(Exception):
    """The run stopped because a person asked (Ctrl-C, SIGTERM, the STOP file): control flow, not an
    error (cli/train.py prints where the run is and the command that continues it). ``checkpoint``: the
    one written (None: none was, e.g. a second Ctrl-C or nothing trained yet)."""

    def __init__(self, reason: str, step: int, checkpoint: Path | None = None, at_once: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.step, self.checkpoint, self.at_once = reason, step, checkpoint, at_once


class DataRanOut(Exception):
    """A step found no data left for it (an asynchronous run whose dynamic sampling read the data
    ahead): the run ends as when its batch source runs out. Control flow, never shown to a user."""


class CheckpointThenStop(PosttrainError):
    """An error after which the trainer's own state is still sound: the skeleton writes a checkpoint,
    then raises :meth:`with_checkpoint`'s error naming it, from this one. Raised from a
    :class:`~posttrain.errors.ProcessLost` (``raise ... from err``), it is restartable
    (:func:`~posttrain.errors.is_restartable`)."""

    def with_checkpoint(self, path: Path) -> PosttrainError:
        """The same error naming ``path``; the skeleton raises it from this one, so its cause stays in the chain."""
        return type(self)(f"{self} The trainer's state is in {path}; fix the cause and run the same command to resume.")


class StopSignal:
    """Ctrl-C / SIGTERM / the STOP file, noticed at clean points (:meth:`check`). During a
    validation (:meth:`interruptible`) the first signal stops at once; a second signal always does.

    A signal that stops at once raises ``KeyboardInterrupt`` wherever the main thread is, holding the
    :class:`Stopped` it stands for; :meth:`as_stopped` (inside :meth:`installed` and
    :meth:`interruptible`, and around the run's loop) raises that instead. KeyboardInterrupt first,
    because the main thread is usually inside ``ray.wait``/``ray.get``, whose signal check passes a
    KeyboardInterrupt on and turns any other exception into a ``SystemError``."""

    def __init__(self, run_dir: Path) -> None:
        self.stop_file = run_dir / STOP_FILE
        self.requested = threading.Event()
        self.reason = ""
        self.pending: Stopped | None = None  # what the KeyboardInterrupt in flight stands for
        self._interruptible = False
        self.finishing = False  # the run is over (stopped or done): what is left is shutting down, which a signal would only cut short

    def check(self, step: int) -> None:
        """Raise :class:`Stopped` if a stop was asked for."""
        if not self.requested.is_set() and self.stop_file.exists():
            self.requested.set()
            self.reason = f"{self.stop_file} exists"
        if self.requested.is_set():
            raise Stopped(self.reason, step)

    @contextmanager
    def as_stopped(self) -> Iterator[None]:
        """A KeyboardInterrupt that a signal here raised, as the :class:`Stopped` it stands for (any
        other KeyboardInterrupt stays one)."""
        try:
            yield
        except KeyboardInterrupt:
            if self.pending is None:
                raise
            stopped, self.pending = self.pending, None
            raise stopped from None

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        self._interruptible = True
        try:
            with self.as_stopped():
                yield
        finally:
            self._interruptible = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, while the run lasts (only the main thread can install them)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            with self.as_stopped():
                yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.finishing:
            return
        if self.requested.is_set():
            self._stop_now(Stopped(f"{name} again", -1, at_once=True))
        self.requested.set()
        self.reason = name
        if self._interruptible:
            self._stop_now(Stopped(self.reason, -1))
        print(f"\nposttrain: {self.reason}: stopping after this step with a checkpoint (again to stop at once)", flush=True)

    def _stop_now(self, stopped: Stopped) -> None:
        self.pending = stopped
        raise KeyboardInterrupt(stopped.reason)
