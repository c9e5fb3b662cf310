"""Running the real CLI from a test and acting on it from outside while it runs (killing a worker,
touching the STOP file) once the run reaches a given point."""

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def run(argv: list[str], while_running: Callable[[], None] | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``argv`` to its end (stdout and stderr together), with ``while_running`` in a thread beside it and
    ``env`` added to this process's environment."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}))
    watcher = threading.Thread(target=while_running, daemon=True) if while_running else None
    if watcher:
        watcher.start()
    output, _ = process.communicate(timeout=600)
    return subprocess.CompletedProcess(argv, process.returncode, output, "")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def episodes(path: Path) -> list[dict]:
    """The episodes a validation wrote (``<run dir>/validation/step_N.jsonl``, ``eval --dump-episodes``)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def when(condition: Callable[[], bool], action: Callable[[], None]) -> None:
    """Call ``action`` once ``condition()`` holds (polls; gives up after 5 minutes)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if condition():
            action()
            return
        time.sleep(0.2)


def when_step_logged(run_dir: Path, step: int, action: Callable[[], None]) -> None:
    """Call ``action`` once metrics.jsonl holds ``step``."""
    path = run_dir / "metrics.jsonl"
    when(lambda: path.exists() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines()), action)


def when_checkpointed(run_dir: Path, step: int, action: Callable[[], None]) -> None:
    """Call ``action`` once the checkpoint of ``step`` is committed (the latest pointer names it)."""
    pointer = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    when(lambda: pointer.exists() and pointer.read_text().strip() == str(step), action)


def kill_descendant(marker: str, below: str) -> int:
    """SIGKILL the one process whose command line holds ``marker`` (a service the run started, a Ray
    actor by its process title ``ray::<Class>``) among the descendants of the process below this
    test's whose command line holds ``below`` (the CLI run, e.g. by its run directory); returns its
    pid. Only that run's processes: what other tests in this process left or run is left alone."""
    runs = [p for p in psutil.Process().children(recursive=True) if _cmdline_holds(p, below)]
    assert len(runs) >= 1, f"no process with {below!r} in its command line below this one"
    found = [p for run in runs for p in run.children(recursive=True) if _cmdline_holds(p, marker)]
    assert len(found) == 1, f"{len(found)} processes with {marker!r} in their command line below the run"
    found[0].kill()
    return found[0].pid


def _cmdline_holds(process: psutil.Process, text: str) -> bool:
    try:
        return text in " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return False
