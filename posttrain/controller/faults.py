"""Injected faults, for the kill tests and ``bench/chaos.py``: a worker process that SIGKILLs itself
at a chosen moment, as the kernel's out-of-memory killer or a preempted node would.

    POSTTRAIN_KILL_AT="actor.update@2 actor.sync_weights@3"   role.method@n: as the n-th call (default 1)
                                                               of that method starts in a process
    POSTTRAIN_FAULT_DIR=/some/dir                              where fired faults leave a marker

Each fault fires once per ``POSTTRAIN_FAULT_DIR``: the process writes the fault's marker file, then
kills itself, so the workers a restart starts again do not die the same way. Without the directory
no fault fires. The controller passes both variables on to every worker process it starts
(:func:`forwarded`); a run without them has no fault.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

KILL_AT = "POSTTRAIN_KILL_AT"
FAULT_DIR = "POSTTRAIN_FAULT_DIR"
_calls: Counter[str] = Counter()  # this process's calls, by "role.method"


def forwarded() -> dict[str, str]:
    """The fault variables of this process, for the worker processes it starts."""
    return {name: os.environ[name] for name in (KILL_AT, FAULT_DIR) if os.environ.get(name)}


def parse(spec: str) -> dict[str, int]:
    """``"actor.update@2 actor.generate"`` → ``{"actor.update": 2, "actor.generate": 1}``."""
    faults = {}
    for item in spec.split():
        name, _, nth = item.partition("@")
        if "." not in name or (nth and not nth.isdigit()) or (nth and int(nth) < 1):
            raise ValueError(f"{KILL_AT}: {item!r} is not role.method or role.method@N (N >= 1)")
        faults[name] = int(nth or 1)
    return faults


def on_call(role: str, method: str) -> None:
    """Count this call; SIGKILL this process if it is a fault's moment and that fault has not fired."""
    spec, directory = os.environ.get(KILL_AT), os.environ.get(FAULT_DIR)
    if not spec or not directory:
        return
    name = f"{role}.{method}"
    _calls[name] += 1
    nth = parse(spec).get(name)
    if nth != _calls[name]:
        return
    marker = Path(directory) / f"{name}@{nth}"
    try:
        with open(marker, "x") as out:  # exclusive: only one process fires each fault
            out.write(str(os.getpid()))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
