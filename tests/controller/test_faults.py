"""Injected kills (controller/faults.py): a process dies as its n-th call of the named method starts,
once per fault directory; malformed specs are refused; without the variables nothing happens."""

import os
import signal
import subprocess
import sys

import pytest

from posttrain.controller.faults import FAULT_DIR, KILL_AT, forwarded, parse

CALLS = """
from posttrain.controller.faults import on_call
for n in range(1, 4):
    print(f"update {n}", flush=True)
    on_call("actor", "update")
    on_call("actor", "generate")
"""


def calls(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in (KILL_AT, FAULT_DIR)} | env)


def test_the_nth_call_kills_the_process_once_per_fault_directory(tmp_path):
    first = calls({KILL_AT: "actor.update@2", FAULT_DIR: str(tmp_path)})
    assert first.returncode == -signal.SIGKILL
    assert first.stdout.split("\n")[:-1] == ["update 1", "update 2"]  # died as its 2nd update() started
    assert (tmp_path / "actor.update@2").read_text().isdigit()  # the marker names the process that fired it
    again = calls({KILL_AT: "actor.update@2", FAULT_DIR: str(tmp_path)})  # a restarted worker: the fault has fired
    assert again.returncode == 0 and again.stdout.count("update") == 3


def test_without_a_fault_directory_or_spec_nothing_fires(tmp_path):
    assert calls({KILL_AT: "actor.update@1"}).returncode == 0
    assert calls({FAULT_DIR: str(tmp_path)}).returncode == 0
    assert list(tmp_path.iterdir()) == []


def test_specs_parse_and_malformed_ones_are_refused(monkeypatch):
    assert parse("actor.update@2 actor.generate") == {"actor.update": 2, "actor.generate": 1}
    for bad in ("update@2", "actor.update@0", "actor.update@x"):
        with pytest.raises(ValueError, match="is not role.method"):
            parse(bad)
    monkeypatch.setenv(KILL_AT, "actor.update")
    monkeypatch.delenv(FAULT_DIR, raising=False)
    assert forwarded() == {KILL_AT: "actor.update"}
