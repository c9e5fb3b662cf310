"""Tool classes' instances: one set per episode, each episode's in a process of its own.

    controller ──pipe── host (spawned once per toolbox; imports the classes' modules, runs no tool code)
                          ├── fork ── episode 1's process: one instance of each tool class
                          ├── fork ── episode 2's process
                          └── ...

:class:`InstancePool` is the controller's end, one per :class:`~posttrain.tools.ToolBox`:

    open(fields)     a new episode key; its process is forked from the host, makes each class with no
                     arguments and calls its ``reset`` with the fields it accepts (by parameter name, all
                     of them if it takes ``**kwargs``), within ``timeout_s``; their texts come back
    call(requests)   (key, class index, method, arguments): an episode's calls run one after another,
                     different episodes' side by side, each within ``timeout_s``
    alive(key)       False once the episode's process is gone: a call past its deadline (its process is
                     killed, the only way to stop a call), a process that died, a reset that failed
    release(key)     ``close()`` on each instance that has one (within ``timeout_s``), then the process exits
    close()          releases every episode left, then stops the host

Why a fork per episode: an instance that hangs or crashes takes only its own episode with it, and a
fork of the host, which has imported the classes already, starts in milliseconds (no interpreter
start, no imports: ``bench/tool_classes.py``, 11.5 ms and 2.5 MB of its own per episode against 1.8 s to
spawn an interpreter, on a 2-core CPU). The host is ``spawn``ed (a clean interpreter, safe beside torch's and Ray's threads)
and leads a process group of its own, so that stopping it stops every episode process with it; an
episode process whose host is gone closes its instances and exits; the host exits, releasing its
episodes, when the controller's end of the pipe closes.

A call's result (a method's, or ``call_row_tool``'s for a row's tool) is text cut to the class's
``max_chars`` in the episode's process (as ``ToolFunction`` does); another hook's (``reset``: text, cut
alike; ``reward``: the value as it is) is its own. Failures come back as
:class:`~posttrain.deadlines.CallOutcome`: ``error`` (the exception, described), ``timed_out``,
``died`` (the process died, or was gone before the call).
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import signal
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from posttrain.deadlines import DEFAULT_START_TIMEOUT_S, GONE as DIED, LATE, CallOutcome, Child, describe_exception
from posttrain.tools.load import HOOKS, ROW_CALL, ToolClass, as_text

# (episode key, class index, method name, keyword arguments): one call on an episode's instance
Request = tuple[int, int, str, dict[str, Any]]
# beyond the calls' own deadlines, how long the controller waits for the host before it counts it as hung
HOST_SLACK_S = 30.0


class InstancePool:
    """The controller's end: episodes' instances of ``classes`` in processes forked from one host."""

    def __init__(self, classes: Sequence[ToolClass], timeout_s: float, start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.classes, self.timeout_s, self.start_timeout_s = list(classes), timeout_s, start_timeout_s
        self._process: Child | None = None  # the host
        self._live: set[int] = set()
        self._next_key = 0

    def open(self, fields: Mapping[str, Any]) -> tuple[int, CallOutcome]:
        """A new episode's key, and its resets' outcome (value: one text per class); a failed one leaves
        the key not alive."""
        key, self._next_key = self._next_key, self._next_key + 1
        start = self._process is None or not self._process.alive
        if start:
            self._stop()
            # the host leads a process group (os.setsid in _host): stopping it, after 5 s to release its
            # episodes by itself once its pipe closes, kills every episode process with it
            self._process = Child(_host, (self.classes, self.timeout_s), name="posttrain-tool-classes", group=True, grace_s=5.0)
        outcome = self._ask(("open", key, dict(fields)), self.timeout_s + (self.start_timeout_s if start else 0.0))
        if outcome is None:
            return key, CallOutcome(error="the tool classes' host process died or hung while starting the episode", died=True)
        if outcome.ok:
            self._live.add(key)
        return key, outcome

    def alive(self, key: int) -> bool:
        return key in self._live

    def call(self, requests: Sequence[Request]) -> list[CallOutcome]:
        """One outcome per request, in order; a request to an episode that is not alive is ``died``."""
        outcomes = [GONE] * len(requests)
        sent = [i for i, request in enumerate(requests) if request[0] in self._live]
        if sent:
            per_episode = max(Counter(requests[i][0] for i in sent).values())  # its calls run one after another
            answers = self._ask(("call", [requests[i] for i in sent]), per_episode * self.timeout_s + HOST_SLACK_S)
            for i, answer in zip(sent, answers or [HOST_LOST] * len(sent), strict=True):
                outcomes[i] = answer
                if answer.timed_out or answer.died:
                    self._live.discard(requests[i][0])
        return outcomes

    def release(self, key: int) -> None:
        """The episode is over: its instances' ``close()``, then its process ends."""
        if key in self._live:
            self._live.discard(key)
            self._ask(("release", key), self.timeout_s + HOST_SLACK_S)

    def close(self) -> None:
        """Release every episode left (their ``close()`` hooks run) and stop the host."""
        if self._process is not None and self._live:
            self._ask(("release", *sorted(self._live)), self.timeout_s + HOST_SLACK_S)
        self._stop()

    def _ask(self, message: tuple[Any, ...], wait_s: float) -> Any:
        """The host's answer, or None after stopping it when it died or took longer than ``wait_s``."""
        if self._process.send(message):
            answer = self._process.answer(wait_s)
            if answer is not LATE and answer is not DIED:
                return answer
        self._stop()  # hung or dead: every episode in it is lost
        return None

    def _stop(self) -> None:
        if self._process is not None:
            self._process.stop()
        self._process = None
        self._live.clear()


GONE = CallOutcome(error="this episode's tool instances are gone (an earlier call timed out or crashed, or reset failed)", died=True)
HOST_LOST = CallOutcome(error="the tool classes' host process died or hung", died=True)


# ---- the host: loads the classes, forks a process per episode, relays calls with their deadlines ----


def _host(connection: Connection, classes: Sequence[ToolClass], timeout_s: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops this process
    os.setsid()  # a process group of its own: stopping it stops its episodes' processes
    host = _Host(connection, classes, timeout_s)
    try:
        while True:
            try:
                kind, *arguments = connection.recv()
            except (EOFError, OSError):  # the controller closed its end, or died
                return
            reply = host.open(*arguments) if kind == "open" else host.calls(arguments[0]) if kind == "call" else host.release(arguments)
            connection.send(reply)
    finally:
        host.release(list(host.episodes))


class _Host:
    """The episodes' processes, by key: their pipes and process ids."""

    def __init__(self, connection: Connection, classes: Sequence[ToolClass], timeout_s: float) -> None:
        self.connection, self.timeout_s = connection, timeout_s
        self.max_chars = [tool_class.max_chars for tool_class in classes]
        try:
            self.classes: list[type] | str = [tool_class.load() for tool_class in classes]
        except BaseException as error:
            self.classes = f"cannot load the tool classes: {describe_exception(error)}"
        self.episodes: dict[int, Connection] = {}
        self.pids: dict[int, int] = {}

    def open(self, key: int, fields: dict[str, Any]) -> CallOutcome:
        if isinstance(self.classes, str):
            return CallOutcome(error=self.classes)
        parent_end, child_end = multiprocessing.Pipe()
        try:
            pid = os.fork()
        except OSError as error:  # out of memory or of processes: this episode fails, the host goes on
            parent_end.close()
            child_end.close()
            return CallOutcome(error=f"cannot start the episode's tool process: {describe_exception(error)}")
        if pid == 0:  # the episode's process: it keeps only its own end of its own pipe
            try:
                for inherited in (self.connection, parent_end, *self.episodes.values()):
                    inherited.close()
                _episode(child_end, self.classes, self.max_chars, fields)
            finally:
                os._exit(0)
        child_end.close()
        self.episodes[key], self.pids[key] = parent_end, pid
        outcome = self.calls([(key, 0, "reset", {})])[0]
        if not outcome.ok:  # a reset that raised: the process closes the instances it made, and exits
            self.release([key])
        return outcome

    def calls(self, requests: Sequence[Request]) -> list[CallOutcome]:
        """Each request's outcome: an episode's requests in order, episodes side by side, each within the
        deadline. A ``reset`` request is not sent: the process resets by itself when it starts."""
        outcomes: list[CallOutcome] = [GONE] * len(requests)
        queues: dict[int, deque[int]] = {}
        for position, request in enumerate(requests):
            queues.setdefault(request[0], deque()).append(position)
        running: dict[int, tuple[int, float]] = {}  # key -> (position, deadline) of its call under way

        def send_next(key: int) -> None:
            if queues[key] and key in self.episodes:
                position = queues[key].popleft()
                _, class_index, method, arguments = requests[position]
                try:
                    if method != "reset":
                        self.episodes[key].send((class_index, method, arguments))
                    running[key] = (position, time.monotonic() + self.timeout_s)
                except OSError:
                    outcomes[position] = self.died(key)

        for key in queues:
            send_next(key)
        while running:
            now = time.monotonic()
            for key, (position, deadline) in list(running.items()):
                if deadline <= now:  # killing the process is the only way to stop the call
                    del running[key]
                    self.drop(key)
                    outcomes[position] = CallOutcome(timed_out=True)
            waiting = {self.episodes[key]: key for key in running}
            earliest = min((deadline for _, deadline in running.values()), default=now)
            for ready in wait(list(waiting), timeout=max(earliest - now, 0.0)):
                key = waiting[ready]
                position, _ = running.pop(key)
                try:
                    outcomes[position] = ready.recv()
                except (EOFError, OSError):
                    outcomes[position] = self.died(key)
                send_next(key)
        return outcomes

    def release(self, keys: Sequence[int]) -> str:
        """Ask each episode's process to close its instances and exit; any still running after the deadline is killed."""
        waiting = {}
        for key in keys:
            if key in self.episodes:
                waiting[self.episodes[key]] = key
                try:
                    self.episodes[key].send("close")
                except OSError:
                    pass
        deadline = time.monotonic() + self.timeout_s
        while waiting and (left := deadline - time.monotonic()) > 0:
            for ready in wait(list(waiting), timeout=left):
                try:
                    ready.recv()  # nothing comes after "close": this is the end of the pipe
                except (EOFError, OSError):
                    self.drop(waiting.pop(ready))
        for key in waiting.values():
            self.drop(key)
        return "released"

    def died(self, key: int) -> CallOutcome:
        return CallOutcome(error=f"the episode's tool process died ({self.drop(key)})", died=True)

    def drop(self, key: int) -> str:
        """Kill the episode's process (if it still runs) and reap it; how it ended."""
        connection, pid = self.episodes.pop(key), self.pids.pop(key)
        connection.close()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
        return f"exit code {os.waitstatus_to_exitcode(status)}"


# ---- an episode's process ----


def _episode(connection: Connection, classes: Sequence[type], max_chars: Sequence[int], fields: dict[str, Any]) -> None:
    """Make the instances, answer with their resets' texts, then run calls until "close" or the host is gone."""
    instances: list[Any] = []
    try:
        try:
            texts = []
            for cls, limit in zip(classes, max_chars):
                instances.append(cls())
                text = _hook(instances[-1], "reset", fields)
                texts.append("" if text is None else as_text(text, limit))
        except BaseException as error:
            connection.send(CallOutcome(error=describe_exception(error)))
            return
        connection.send(CallOutcome(value=texts))
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                break
            if message == "close":
                break
            class_index, method, arguments = message
            outcome = _run(instances[class_index], method, arguments, max_chars[class_index])
            try:
                connection.send(outcome)
            except Exception as error:  # e.g. a reward that cannot be pickled
                connection.send(CallOutcome(error=f"the result cannot be sent back: {describe_exception(error)}"))
    finally:  # the instances made so far, whatever ended the episode's process (not a kill)
        for instance in instances:
            try:
                _hook(instance, "close", {})
            except BaseException:  # noqa: S110 - a failing release hook must not keep the others from running
                pass


def _run(instance: Any, method: str, arguments: dict[str, Any], max_chars: int) -> CallOutcome:
    try:
        if method == ROW_CALL:  # a row's tool: its result is a tool's, cut alike
            return CallOutcome(value=as_text(_hook(instance, method, arguments), max_chars))
        if method in HOOKS:
            return CallOutcome(value=_hook(instance, method, arguments))
        return CallOutcome(value=as_text(_awaited(getattr(instance, method)(**arguments)), max_chars))
    except BaseException as error:  # SystemExit from a method must not end the process either
        return CallOutcome(error=describe_exception(error))


def _hook(instance: Any, name: str, fields: Mapping[str, Any]) -> Any:
    """``instance.name(**the fields it accepts)``; None if the class has no such hook."""
    hook = getattr(instance, name, None)
    if hook is None:
        return None
    parameters = inspect.signature(hook).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        fields = {key: value for key, value in fields.items() if key in parameters}
    return _awaited(hook(**fields))


def _awaited(value: Any) -> Any:
    if inspect.isawaitable(value):
        async def wait_for() -> Any:
            return await value

        return asyncio.run(wait_for())
    return value
