"""Calls with a deadline each, so that one that raises or hangs costs a sample (or a tool call), never the
run: what the reward path (score functions) and the tools' Python functions run through.

:class:`ProcessScorer` runs the calls in a child process, one after another, and gives each call
its own deadline. A call past its deadline has the whole child killed (SIGKILL), is reported as
timed out, and a fresh child carries on with the remaining calls. A process is used rather than a
thread because a thread cannot be stopped: a score function stuck in a regex or in sympy would keep
a core busy, and hold the GIL, for the rest of the run. The child is started with ``spawn`` (a
clean interpreter, safe beside the threads of torch and Ray in this process) and imports only what
the score functions need; the :mod:`posttrain.rewards` package root is kept free of torch for that
reason. Score functions therefore must be picklable: module-level functions, ``functools.partial``
of them, or :class:`~posttrain.rewards.custom.FileScoreFunction`.

Both scorers also take a ``budget_s`` per run: the seconds ALL its calls together may take (a step's
scoring). Once it is spent, the call under way (which :class:`ProcessScorer` kills) and every call
not yet made time out, with the reason in ``error``. Only time spent in calls is charged: starting
the child and loading the functions are not.

:class:`InlineScorer` calls in this process with no deadline (``timeout_s=None``): exceptions are
still contained, but a hanging function hangs the caller. It is for trusted, fast functions and for
functions that cannot be pickled.

:class:`ServiceScorer` is for a score function that asks a service (an LLM judge on a Ray worker or at
a URL: a client a child process could not hold, or reach as an actor), marked ``in_process = True``
(:func:`runs_in_process`). Its calls run in this process, side by side in threads (the service batches
what arrives together), each with a deadline; a call past it is a timeout and its answer, if one ever
comes, is dropped (a thread cannot be stopped: the client's own request timeout ends it).

All return one :class:`CallOutcome` per call, in order. None is thread-safe.

:class:`Child` is the process end they share with the tool classes' host (``tools/instances.py``): a
``spawn``ed child at the end of a pipe, asked with a deadline, killed (with its process group, where it
leads one) when it is late, dies or is closed, and never outliving this process or its owner.
:func:`kill_group` is the kill, also for the python tool's program (``tools/sandbox.py``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# (index into the function table, keyword arguments): one score-function call.
Call = tuple[int, dict[str, Any]]
# Starting the child and loading the score functions' modules there (math-verify imports sympy) is
# not charged to any call; it gets this long.
DEFAULT_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CallOutcome:
    value: Any = None
    error: str | None = None  # "ValueError: ... (file.py:12 in f)" when the call raised or its process died; why, for a timeout past the budget
    timed_out: bool = False
    died: bool = False  # the child process died during the call (a crash, not an exception the call raised)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


def describe_exception(error: BaseException) -> str:
    """``"Type: message (file:line in function)"``, the innermost frame being where it was raised."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _call(functions: Sequence[Callable[..., Any]], call: Call) -> CallOutcome:
    index, arguments = call
    try:
        return CallOutcome(value=functions[index](**arguments))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit from a user's function must not end the scorer either
        return CallOutcome(error=describe_exception(error))


class Budget:
    """Seconds left of a run's total time for scoring (``None``: no limit)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.left = math.inf if seconds is None else seconds

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def charge(self, seconds: float) -> None:
        self.left -= seconds

    def outcomes(self, count: int) -> list[CallOutcome]:
        """Timeouts for ``count`` calls that the spent budget left unfinished."""
        reason = f"not scored within the budget of {self.seconds:g} s for all of this batch's calls"
        return [CallOutcome(error=reason, timed_out=True)] * count


class InlineScorer:
    """Calls in this process, exceptions contained, no deadline; a call cannot be stopped, so the
    budget only spares the calls after it is spent."""

    def run(
        self, functions: Sequence[Callable[..., Any]], calls: Sequence[Call], timeout_s: float | None = None, budget_s: float | None = None,
    ) -> list[CallOutcome]:
        budget, outcomes = Budget(budget_s), []
        for call in calls:
            if budget.spent:
                return outcomes + budget.outcomes(len(calls) - len(outcomes))
            start = time.monotonic()
            outcomes.append(_call(functions, call))
            budget.charge(time.monotonic() - start)
        return outcomes

    def close(self) -> None:
        pass


def runs_in_process(function: Callable[..., Any]) -> bool:
    """A score function that asks a service from this process (``in_process = True`` on it)."""
    return bool(getattr(function, "in_process", False))


class ServiceScorer:
    """Calls in this process, ``max_concurrent`` at a time in threads, each with a deadline of
    ``timeout_s`` seconds from its start (module docstring)."""

    def __init__(self, timeout_s: float | None, max_concurrent: int = 16) -> None:
        self.timeout_s, self.max_concurrent = timeout_s, max_concurrent

    def run(
        self, functions: Sequence[Callable[..., Any]], calls: Sequence[Call], timeout_s: float | None = None, budget_s: float | None = None,
    ) -> list[CallOutcome]:
        from concurrent.futures import ThreadPoolExecutor, wait

        deadline_s = timeout_s or self.timeout_s
        budget, outcomes = Budget(budget_s), []
        for wave in range(0, len(calls), self.max_concurrent):
            if budget.spent:
                return outcomes + budget.outcomes(len(calls) - len(outcomes))
            # a pool per wave: a late call keeps its thread (its client's own timeout ends it), never a later call's
            pool = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="posttrain-score")
            start = time.monotonic()
            futures = [pool.submit(_call, functions, call) for call in calls[wave: wave + self.max_concurrent]]
            pool.shutdown(wait=False)
            deadline = deadline_s if deadline_s is not None else math.inf
            late = (f"not answered within its deadline of {deadline_s:g} s" if deadline <= budget.left
                    else f"not scored within the budget of {budget.seconds:g} s for all of this batch's calls")
            limit = min(deadline, budget.left)
            wait(futures, timeout=None if math.isinf(limit) else limit)
            budget.charge(time.monotonic() - start)
            outcomes += [future.result() if future.done() else CallOutcome(error=late, timed_out=True) for future in futures]
        return outcomes

    def close(self) -> None:
        pass


def check_picklable(function: Callable[..., Any], label: str) -> None:
    """TypeError naming ``label`` and the fixes if ``function`` cannot be sent to the scoring process."""
    try:
        pickle.dumps(function)
    except Exception as error:
        raise TypeError(
            f"score function {label} cannot be sent to the scoring process ({type(error).__name__}: {error}); "
            "lambdas and functions defined inside other functions cannot be pickled. Define it at module "
            "level or in a .py file (custom_reward_function.path), or score in-process without a "
            "timeout (timeout_s=None)"
        ) from None


class ProcessScorer:
    """Calls in a child process, each with a deadline of ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float, start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}; use InlineScorer for no deadline")
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._child: Child | None = None

    def run(
        self, functions: Sequence[Callable[..., Any]], calls: Sequence[Call], timeout_s: float | None = None, budget_s: float | None = None,
    ) -> list[CallOutcome]:
        """One outcome per call; ``timeout_s`` overrides the per-call deadline for this run, ``budget_s``
        bounds all its calls together."""
        deadline_s = timeout_s or self.timeout_s
        budget = Budget(budget_s)
        blob = pickle.dumps(list(functions))
        outcomes: list[CallOutcome] = []
        try:
            while len(outcomes) < len(calls):
                if budget.spent:
                    return outcomes + budget.outcomes(len(calls) - len(outcomes))
                outcomes += self._run_until_failure(blob, calls[len(outcomes):], deadline_s, budget)
        except BaseException:
            self._stop()  # a child left mid-run would answer the next run with stale results
            raise
        return outcomes

    def _run_until_failure(self, blob: bytes, calls: Sequence[Call], deadline_s: float, budget: Budget) -> list[CallOutcome]:
        """Outcomes of a prefix of ``calls``, ending at the first timeout or death of the child (included);
        all of them when the budget runs out (the rest as timeouts)."""
        load_failure = self._start_run(blob, calls)
        if load_failure is not None:
            return [load_failure for _ in calls]
        outcomes = []
        for _ in calls:
            wait_s = min(deadline_s, budget.left)
            start = time.monotonic()
            answer = self._child.answer(max(wait_s, 0.0))
            budget.charge(time.monotonic() - start)
            if answer is LATE:
                self._stop()
                if wait_s < deadline_s:  # the budget ran out before the call's own deadline
                    budget.charge(math.inf)
                    return outcomes + budget.outcomes(len(calls) - len(outcomes))
                return outcomes + [CallOutcome(timed_out=True)]
            if answer is GONE:
                exit_code = self._stop()
                return outcomes + [CallOutcome(error=f"the scoring process died (exit code {exit_code})", died=True)]
            outcomes.append(answer)
        return outcomes

    def _start_run(self, blob: bytes, calls: Sequence[Call]) -> CallOutcome | None:
        """Send the functions and calls; returns every call's outcome if the child could not load them."""
        if self._child is None or not self._child.alive:
            self._stop()
            self._child = Child(_serve, name="posttrain-scorer")
        if not self._child.send((blob, list(calls))):  # the child died before reading (e.g. it could not start)
            return CallOutcome(error=f"the scoring process died before it could score (exit code {self._stop()})", died=True)
        answer = self._child.answer(self.start_timeout_s)
        if answer is LATE:
            self._stop()
            return CallOutcome(error=f"loading the score functions in the scoring process took over {self.start_timeout_s:.0f} s")
        if answer is GONE:
            return CallOutcome(error=f"the scoring process died while loading the score functions (exit code {self._stop()})", died=True)
        status, message = answer
        return CallOutcome(error=message) if status == "load_error" else None

    def _stop(self) -> int | None:
        """Kill the child if there is one; returns its exit code."""
        child, self._child = self._child, None
        return child.stop() if child is not None else None

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> ProcessScorer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


LATE, GONE = object(), object()  # Child.answer: no answer within the time asked; the child died (or its pipe closed)


class Child:
    """A ``spawn``ed child process (a clean interpreter, safe beside torch's and Ray's threads) running
    ``target(connection, *args)`` at the end of a pipe. It is a daemon (killed when this process exits)
    and is stopped when this object is collected. ``group``: it makes itself the leader of a process
    group (``os.setsid()`` in ``target``), so that stopping it kills what it forked too; ``grace_s``:
    how long :meth:`stop` waits, after closing the pipe, for the child to end by itself first."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...] = (), *, name: str, group: bool = False,
                 grace_s: float = 0.0) -> None:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        self.process = context.Process(target=target, args=(child_end, *args), daemon=True, name=name)
        self.process.start()
        child_end.close()
        self.connection = parent_end
        self._finalizer = weakref.finalize(self, _stop_child, self.process, parent_end, group, grace_s)

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and self.process.is_alive()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, message: Any) -> bool:
        """False when the child is gone (its end of the pipe closed)."""
        try:
            self.connection.send(message)
            return True
        except OSError:
            return False

    def answer(self, wait_s: float) -> Any:
        """The child's next message, :data:`LATE` if none came within ``wait_s`` seconds, :data:`GONE` if it died."""
        try:
            if not self.connection.poll(wait_s):
                return LATE
            return self.connection.recv()
        except (EOFError, OSError):
            return GONE

    def stop(self) -> int | None:
        """Stop the child (at once, or after ``grace_s``) and reap it; its exit code."""
        self._finalizer()
        return self.process.exitcode


def kill_group(pid: int) -> bool:
    """SIGKILL the process group that ``pid`` leads; False when there is none (it never led one, or all of
    it is gone). A leader not yet reaped keeps its group id from being reused."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_child(process: Any, connection: Any, group: bool, grace_s: float) -> None:
    connection.close()  # a child that reads its pipe ends by itself now
    if grace_s > 0:
        process.join(timeout=grace_s)
    # whether it ended or not: what it forked may outlive it, stuck in a call
    if not (group and kill_group(process.pid)) and process.is_alive():
        process.kill()
    process.join(timeout=10)


def _serve(connection: Any) -> None:
    """The child's loop: receive (pickled functions, calls), answer "loaded", then one outcome per call."""
    # Ctrl-C reaches every process of the terminal's group: the trainer decides when to stop, and stops this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            blob, calls = connection.recv()
        except (EOFError, OSError):  # the parent closed its end or died: nothing more to do
            return
        try:
            functions = pickle.loads(blob)
        except BaseException as error:
            connection.send(("load_error", f"cannot load the score functions: {describe_exception(error)}"))
            continue
        connection.send(("loaded", None))
        for call in calls:
            outcome = _call(functions, call)
            try:
                connection.send(outcome)
            except Exception as error:  # e.g. a result that cannot be pickled
                connection.send(CallOutcome(error=f"the score function's result cannot be sent back: {describe_exception(error)}"))
