"""posttrain/deadlines.py's Child, the process end the scorer and the tool classes' host share: a late
answer, a dead child, and a stop that takes what the child forked with it (when it leads a group) and
waits out its grace first."""

from __future__ import annotations

import os
import signal
import time

from posttrain.deadlines import GONE, LATE, Child, kill_group


def _echo(connection) -> None:
    """Answers each message; "sleep" is never answered; "die" ends the process; "fork" leaves a grandchild
    that sleeps a minute (in its group with ``setsid`` first), and answers with its pid."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message == "sleep":
            time.sleep(3600)
        elif message == "die":
            os._exit(3)
        elif message in ("fork", "fork in group"):
            if message == "fork in group":
                os.setsid()
            pid = os.fork()
            if pid == 0:
                connection.close()
                time.sleep(60)
                os._exit(0)
            connection.send(pid)
        else:
            connection.send(message)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_an_answer_a_late_one_and_a_dead_child():
    child = Child(_echo, name="posttrain-test-child")
    try:
        assert child.send("hello") and child.answer(30) == "hello"
        assert child.send("sleep") and child.answer(0.5) is LATE
    finally:
        child.stop()
    assert not child.alive and not _alive(child.pid)
    dying = Child(_echo, name="posttrain-test-child")
    assert dying.send("die") and dying.answer(30) is GONE and dying.stop() == 3


def test_stopping_a_group_leader_kills_what_it_forked_and_a_plain_child_leaves_it():
    leader = Child(_echo, name="posttrain-test-child", group=True)
    assert leader.send("fork in group")
    grandchild = leader.answer(30)
    leader.stop()
    assert _gone_within(grandchild, 5), "the group's grandchild outlived its leader's stop"
    plain = Child(_echo, name="posttrain-test-child")
    assert plain.send("fork")
    orphan = plain.answer(30)
    try:
        plain.stop()
        assert not _gone_within(orphan, 1.0)  # not a group leader: its stop reaches the child alone
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_a_stop_with_grace_lets_the_child_end_by_itself_once_its_pipe_closes():
    child = Child(_echo, name="posttrain-test-child", grace_s=10.0)
    assert child.send("ping") and child.answer(30) == "ping"
    start = time.monotonic()
    assert child.stop() == 0  # it read EOF and returned: exit 0, not a kill's -9
    assert time.monotonic() - start < 10.0


def test_kill_group_of_no_group_says_so():
    assert kill_group(2 ** 22 + 12345) is False
