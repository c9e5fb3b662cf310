"""Agent programs, one run per episode, each in a process of its own (docs/programs.md).

    controller ──pipe── host (spawned once; imports openai and the program's module, runs no program)
                          ├── fork ── episode 1: the program, with a client for episode 1's base URL
                          └── fork ── episode 2 ...

The program is ``entry``, ``path/to/file.py:function`` (or ``module:function``), either

    async def rollout(client: openai.AsyncOpenAI, row: dict) -> float | dict | None
    def rollout(client: openai.OpenAI, row: dict) -> float | dict | None

``row`` holds the dataset row: ``messages`` (its prompt), ``ground_truth``, ``data_source``,
``extra_info``. ``OPENAI_BASE_URL`` is set to the episode's base URL too (and ``OPENAI_API_KEY`` to a
placeholder), for a program that makes its own client inside the function; a client made when the module
is imported would not know the episode's URL. Each episode's process leads a process group of its own,
killed when its answer comes or its deadline passes, so what a program starts ends with it. What it returns is the episode's score (a number, or ``{"score": ..., "acc": ...}``);
``None`` leaves the score to the row's score function.

Or the program is ``command``, a shell command run once per episode with ``OPENAI_BASE_URL`` set: the
row comes as JSON on its standard input, and the last line it prints is its return as JSON (a number,
``{"score": ..., "acc": ...}`` or ``null``); a non-zero exit is the program's error.

``env.name: program`` takes these as ``env.options`` (:class:`ProgramEnv`, checked before any worker):
``entry`` or ``command``, ``deadline_s`` (one episode's time), ``refuse_other_sampling`` and ``gather_s``
(rollout/endpoint.py), ``use_retriever`` (the run starts its retriever, or connects to ``env.retriever.url``, and
the programs find it at ``$POSTTRAIN_RETRIEVER_URL``: a search agent's tool calls it).

:meth:`ProgramHost.run` runs every episode given side by side and waits for them until a deadline. Each
outcome is a :class:`~posttrain.deadlines.CallOutcome`: ``value`` (what the program returned), ``error``
(what it raised, or a return that is not a score), ``timed_out`` (still running at the deadline: its
process is killed, the only way to stop it), ``died`` (its process ended without an answer). None of
them stops the run. A fork starts in milliseconds because the host has imported everything already; the
host is ``spawn``ed (a clean interpreter, safe beside torch's and Ray's threads) and leads a process group
of its own, so stopping it stops every episode's process.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any

from posttrain.agents.env import Environment, StepResult
from posttrain.deadlines import DEFAULT_START_TIMEOUT_S, GONE, LATE, CallOutcome, Child, describe_exception
from posttrain.errors import InputError, import_optional
from posttrain.rewards.custom import import_source

HOST_SLACK_S = 30.0  # beyond the episodes' deadline, how long the controller waits for the host


class ProgramError(InputError):
    """An entry that cannot be a program: a missing file or function, a wrong signature."""


def load_program(entry: str) -> Callable[..., Any]:
    """The function ``entry`` names (``file.py:function`` or ``module:function``), checked to take
    ``(client, row)``; a :class:`ProgramError` saying what is wrong otherwise."""
    source, _, name = str(entry).rpartition(":")
    if not source or not name:
        raise ProgramError(f"env.options.entry={entry!r}: give FILE.py:FUNCTION or MODULE:FUNCTION, e.g. my_agent.py:rollout")
    module = import_source(source, "posttrain_user_program_", ProgramError, f"env.options.entry={entry!r}")
    function = getattr(module, name, None)
    if not callable(function) or inspect.isclass(function):
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise ProgramError(f"env.options.entry={entry!r}: {source} has no function {name!r} (its functions: {defined})")
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if len(parameters) != 2:
        raise ProgramError(f"env.options.entry={entry!r}: {name}{inspect.signature(function)} must take exactly two "
                           "arguments, (client, row): an openai client for the episode and the dataset row")
    return function


def program_score(value: Any) -> tuple[float | None, bool | None]:
    """(score, acc) from what a program returned: a number, ``{"score": x[, "acc": y]}``, or None (the
    row's score function decides: (None, None)). Anything else is a :class:`ValueError`."""
    if value is None:
        return None, None
    if isinstance(value, Mapping) and "score" in value:
        score, acc = value["score"], value.get("acc")
    else:
        score, acc = value, None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise ValueError(f"the program returned {value!r}; return a finite number, {{'score': x, 'acc': y}}, or None")
    return float(score), None if acc is None else bool(acc)


def command_program(command: str) -> Callable[[Any, dict[str, Any]], Any]:
    """A program that runs ``command`` in a shell (module docstring): the row as JSON on its standard
    input, its last printed line as JSON its return."""
    if not str(command).strip():
        raise ProgramError("env.options.command is empty; give the shell command that runs your agent")

    def run(client: Any, row: dict[str, Any]) -> Any:
        done = subprocess.run(command, shell=True, input=json.dumps(row, default=str), text=True, capture_output=True, check=False)
        if done.returncode:
            raise RuntimeError(f"`{command}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")
        lines = done.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else None
        except ValueError:
            raise RuntimeError(f"`{command}` printed {lines[-1][:200]!r} last; print its score as JSON (a number, "
                               "{\"score\": x, \"acc\": y} or null)") from None

    run.without_client = True  # type: ignore[attr-defined]  (the command makes its own, from OPENAI_BASE_URL)
    return run


class ProgramEnv(Environment):
    """``env.name: program``: the options of a user's program (module docstring), checked when built;
    the episodes themselves are runs of the program (rollout/program.py), never reset or stepped."""

    name = "program"
    runs_program = True

    def __init__(self, entry: str | None = None, command: str | None = None, deadline_s: float = 300.0,
                 refuse_other_sampling: bool = False, gather_s: float = 0.25, use_retriever: bool = False) -> None:
        if (entry is None) == (command is None):
            raise ProgramError("env.name=program needs exactly one of env.options.entry (FILE.py:FUNCTION or "
                               "MODULE:FUNCTION, an async def rollout(client, row)) and env.options.command (a shell command)")
        if entry is not None:
            import_optional("openai", package="openai", hint='pip install "posttrain[programs]"',
                            needed_by="env.name=program gives each episode's program an openai client")
            load_program(entry)
        else:
            command_program(command)
        for name, value in (("deadline_s", deadline_s), ("gather_s", gather_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (name == "deadline_s" and value == 0):
                raise ProgramError(f"env.options.{name}={value!r}: give a finite number of seconds ({'> 0' if name == 'deadline_s' else '>= 0'})")
        for name, value in (("refuse_other_sampling", refuse_other_sampling), ("use_retriever", use_retriever)):
            if not isinstance(value, bool):
                raise ProgramError(f"env.options.{name}={value!r}: give true or false")
        self.entry, self.command, self.deadline_s = entry, command, float(deadline_s)
        self.refuse_other_sampling, self.gather_s = bool(refuse_other_sampling), float(gather_s)
        self.use_retriever = bool(use_retriever)

    def reset(self, sample: Any) -> str:
        raise RuntimeError("a program's episodes are runs of the program (rollout/program.py); ProgramEnv is never reset")

    def step(self, action: str) -> StepResult:
        raise RuntimeError("a program's episodes are runs of the program (rollout/program.py); ProgramEnv is never stepped")


class ProgramHost:
    """The controller's end: runs of ``entry`` (or ``command``) in processes forked from one host."""

    def __init__(self, entry: str | None = None, command: str | None = None, start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        if (entry is None) == (command is None):
            raise ProgramError("a program is an entry (FILE.py:FUNCTION) or a command, exactly one of them")
        if entry is not None:  # refused here, in the controller, with the reason
            load_program(entry)
        else:
            command_program(command)
        self.entry, self.command, self.start_timeout_s = entry, command, start_timeout_s
        self._process: Child | None = None

    def run(self, jobs: Sequence[tuple[str, dict[str, Any]]], deadline_s: float,
            ended: Callable[[int], None] | None = None) -> list[CallOutcome]:
        """One outcome per ``(base_url, row)`` job, in order (module docstring); ``ended(index)`` is called
        as each job's run ends, before the others' (e.g. to stop waiting for its requests)."""
        if not jobs:
            return []
        started = self.start()
        deadline = time.monotonic() + deadline_s + HOST_SLACK_S + (self.start_timeout_s if started else 0.0)
        answer: Any = GONE
        if self._process.send((list(jobs), deadline_s)):
            try:
                answer = self._process.answer(deadline - time.monotonic())
                while isinstance(answer, int):  # a job that ended; the list of outcomes comes last
                    if ended is not None:
                        ended(answer)
                    answer = self._process.answer(deadline - time.monotonic())
            except BaseException:  # e.g. Ctrl-C: its answers would reach the next run; it stops, with its episodes
                self.close()
                raise
        if answer is LATE or answer is GONE:
            self.close()
            return [CallOutcome(error="the programs' host process died or hung", died=True)] * len(jobs)
        if isinstance(answer, str):  # the host could not load the program
            self.close()
            raise ProgramError(answer)
        return answer

    def start(self) -> bool:
        """Spawn the host unless it runs (its imports then happen before the first episodes, not during
        them); whether it was spawned now."""
        if self._process is not None and self._process.alive:
            return False
        self.close()
        self._process = Child(_host, (self.entry, self.command), name="posttrain-programs", group=True, grace_s=5.0)
        return True

    def close(self) -> None:
        if self._process is not None:
            self._process.stop()
        self._process = None


# ---- the host: loads the program, forks a process per episode, waits for them until the deadline ----


def _host(connection: Connection, entry: str | None, command: str | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops this process
    os.setsid()  # a process group of its own: stopping it stops its episodes' processes
    problem = ""
    try:
        if entry is not None:
            _warm_up()
        program = load_program(entry) if entry is not None else command_program(command)
    except BaseException as error:
        program = None
        problem = str(error) if isinstance(error, ProgramError) else describe_exception(error)
    while True:
        try:
            jobs, deadline_s = connection.recv()
        except (EOFError, OSError):  # the controller closed its end, or died
            return
        try:
            connection.send(problem if program is None else _run_all(connection, program, jobs, deadline_s))
        except (EOFError, OSError):  # the controller went away during the episodes (they are killed): nothing to answer
            return


def _kill(pid: int) -> None:
    """SIGKILL the episode's process group (it leads one: what the program started goes with it), then reap it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os.waitpid(pid, 0)


def _run_all(host: Connection, program: Callable[..., Any], jobs: Sequence[tuple[str, dict[str, Any]]],
             deadline_s: float) -> list[CallOutcome]:
    outcomes: list[CallOutcome | None] = [None] * len(jobs)
    children: dict[Connection, tuple[int, int]] = {}  # read end -> (job index, pid)
    for index, (url, row) in enumerate(jobs):
        try:
            read, write = Pipe(duplex=False)
            pid = os.fork()
        except OSError as error:  # out of processes or memory: this episode fails, the others run
            outcomes[index] = CallOutcome(error=f"could not start the program's process: {error}", died=True)
            continue
        if pid == 0:  # the episode's process: never returns to the host's loop
            try:
                os.setpgid(0, 0)
                _die_with_parent()
                for end in (host, read, *children):  # only its own pipe end stays open
                    end.close()
                _episode(write, program, url, row)
            finally:
                os._exit(0)
        write.close()
        children[read] = (index, pid)
    deadline = time.monotonic() + deadline_s
    try:
        while children and (left := deadline - time.monotonic()) > 0:
            for read in wait([*children, host], timeout=left):
                if read is host:  # the controller closed its end (it stops the host): no one waits for the answers
                    raise EOFError("the controller went away")
                index, pid = children.pop(read)
                try:
                    outcomes[index] = read.recv()
                except Exception:  # nothing sent (a crash), or a reply that cannot be read
                    outcomes[index] = CallOutcome(error="the program's process died without an answer", died=True)
                read.close()
                _kill(pid)  # whatever it left running
                host.send(index)  # ended: the controller stops waiting for its requests
        for index, _ in children.values():  # past the deadline
            outcomes[index] = CallOutcome(error=f"the program was still running at its deadline ({deadline_s:g} s)", timed_out=True)
    finally:  # at the deadline, and whatever ends the host's wait early: no episode outlives it
        for read, (_, pid) in children.items():
            _kill(pid)
            read.close()
    return outcomes  # type: ignore[return-value]


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the host dies, however it dies (the host's own group holds
    only the host: each episode leads a group of its own)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the host's cleanup still kills episodes it outlives
        pass


_SSL_CONTEXT: Any = None  # made once in the host, inherited by every episode's process


def _warm_up() -> None:
    """What every episode's client needs, done once in the host before it forks: the openai SDK's lazy
    imports, and a TLS context (the client's certificates load in ~20 ms; 64 episodes on 2 cores would
    spend a second of their start on them)."""
    global _SSL_CONTEXT
    import ssl

    import openai

    _SSL_CONTEXT = ssl.create_default_context()
    with openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="-", http_client=openai.DefaultHttpxClient(verify=_SSL_CONTEXT)) as client:
        client.chat.completions  # noqa: B018 - resolves the SDK's lazily imported resources

    async def touch() -> None:  # the event loop's and the async client's own first-use imports
        async with openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="-",
                                      http_client=openai.DefaultAsyncHttpxClient(verify=_SSL_CONTEXT)) as client:
            client.chat.completions  # noqa: B018

    asyncio.run(touch())


def _episode(write: Connection, program: Callable[..., Any], url: str, row: dict[str, Any]) -> None:
    """Run the program once and send its outcome (the caller exits the process after)."""
    try:
        os.environ["OPENAI_BASE_URL"] = url
        os.environ["OPENAI_API_KEY"] = "posttrain"  # never the trainer's own key: every request goes to the endpoint
        settings = {"base_url": url, "api_key": "posttrain", "max_retries": 0}
        if getattr(program, "without_client", False):
            value = program(None, row)
        elif inspect.iscoroutinefunction(program):
            import openai

            async def main() -> Any:
                async with openai.AsyncOpenAI(**settings, http_client=openai.DefaultAsyncHttpxClient(verify=_SSL_CONTEXT)) as client:
                    return await program(client, row)

            value = asyncio.run(main())
        else:
            import openai

            with openai.OpenAI(**settings, http_client=openai.DefaultHttpxClient(verify=_SSL_CONTEXT)) as client:
                value = program(client, row)
        program_score(value)  # a return that is not a score is the program's error
        outcome = CallOutcome(value=value)
    except BaseException as error:
        outcome = CallOutcome(error=describe_exception(error))
    try:
        write.send(outcome)
    except Exception as error:  # a return that cannot be pickled
        write.send(CallOutcome(error=f"the program's return cannot be sent back: {describe_exception(error)}"))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
