"""What a recipe does with a stage directory whose command changed: a train stage whose only change is more steps
(or epochs) trains further from its checkpoint, as ``posttrain train`` does with the same directory; any other
change starts the stage over, its old directory moved aside (:func:`start_over_or_further`); and which earlier runs'
time counts toward a stage that goes on from its checkpoints (:func:`runs_so_far`)."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path

# a train stage's settings that, raised and nothing else changed, train its run further rather than start it over
MORE_STEPS = ("trainer.total_training_steps", "trainer.total_epochs")
RESUMES = ("sft", "train")  # commands that go on from their checkpoints when run again: each run's time is the stage's


def fingerprint(upstream: str, command: str) -> str:
    """A stage's fingerprint: its command and what the stages before it produced (``upstream``)."""
    return hashlib.sha256(f"{upstream}\n{command}".encode()).hexdigest()[:16]


def settings(command: str) -> tuple[list[str], dict[str, str]]:
    """A stage command's words that are not ``key=value`` settings, and its settings (the last of a key wins, as in
    the run's config)."""
    words, found = [], {}
    for word in shlex.split(command):
        key, equals, value = word.partition("=")
        if equals and not word.startswith("-"):
            found[key] = value
        else:
            words.append(word)
    return words, found


def raised_steps(command_kind: str, started: dict, upstream: str, command: str) -> str:
    """What ``command`` raises of :data:`MORE_STEPS` over the command a train stage started with (``started``, its
    ``STARTED`` record), when nothing else differs and the stages before are unchanged (``upstream`` gives the
    recorded fingerprint with the recorded command): e.g. "trainer.total_training_steps 32 → 48"; "" otherwise.
    A setting the earlier command did not carry counts as a change of its own (the stage starts over)."""
    old = started.get("command")
    if command_kind != "train" or not old or fingerprint(upstream, old) != started.get("fingerprint"):
        return ""
    (old_words, before), (words, after) = settings(old), settings(command)
    if old_words != words or before.keys() != after.keys():
        return ""
    changed = sorted(key for key in after if before[key] != after[key])
    if not changed or not set(changed) <= set(MORE_STEPS) or not all(_more(before[key], after[key]) for key in changed):
        return ""
    return ", ".join(f"{key} {before[key]} → {after[key]}" for key in changed)


def _more(before: str, after: str) -> bool:
    return before.isdigit() and after.isdigit() and int(after) > int(before)


def start_over_or_further(command_kind: str, directory: Path, started: dict, upstream: str, command: str, done: Path) -> str:
    """A stage directory whose ``STARTED`` holds another fingerprint: kept, its ``done`` record removed, where the
    stage trains further (:func:`raised_steps`; the run resumes from its latest checkpoint and a learning-rate
    schedule takes the new length from there); else moved aside to ``NAME.before-TIME``. Returns what was done."""
    raised = raised_steps(command_kind, started, upstream, command)
    if raised:
        done.unlink(missing_ok=True)
        return (f"only its length changed ({raised}): it trains further from its latest checkpoint in {directory}; "
                "the stages after it run again")
    stamp, copies = f"{directory.name}.before-{time.strftime('%Y%m%d-%H%M%S')}", 0
    while (aside := directory.with_name(stamp + (f"-{copies}" if copies else ""))).exists():
        copies += 1  # moved aside twice within a second
    directory.rename(aside)  # another command (or an earlier stage changed): start over, keep the old run
    return f"its command or an earlier stage changed; the previous run moved to {aside}"


def runs_so_far(command_kind: str, started: Path, done: Path, log: Path, fingerprint: str, upstream: str, command: str,
                say) -> tuple[float, int]:
    """Before a stage runs: the wall time and number of its earlier runs that count toward it (a train or sft stage
    that goes on from its checkpoints: run again with the same command, :func:`earlier_runs`, or trained further, the
    run it goes on from); (0, 0) otherwise. A changed stage is first started over or kept to train further
    (:func:`start_over_or_further`, what was done given to ``say``)."""
    earlier, runs = earlier_runs(started, log, fingerprint) if command_kind in RESUMES else (0.0, 0)
    if started.is_file() and (record := json.loads(started.read_text())).get("fingerprint") != fingerprint:
        finished = json.loads(done.read_text()) if done.is_file() else None
        say(start_over_or_further(command_kind, started.parent, record, upstream, command, done))
        if command_kind in RESUMES and started.is_file():  # kept (not moved aside): it trains further
            earlier, runs = ((finished.get("seconds", 0.0), finished.get("runs", 1)) if finished
                             else earlier_runs(started, log, record.get("fingerprint")))
    return earlier, runs


def earlier_runs(started: Path, log: Path, fingerprint: str | None) -> tuple[float, int]:
    """The wall time and number of a resuming stage's earlier runs of this very command (its ``STARTED`` holds
    ``fingerprint``: stopped, failed or killed, and now going on from its checkpoints); (0, 0) for a first run or
    a changed one. The last earlier run's time is from its start (``STARTED``'s ``began``; the file's own time where
    an older recipe wrote it without) to its end (``ended``; for a run killed outright, its log's last line); the
    runs before it are summed in ``earlier_seconds`` (an older recipe kept no such sum: its last run alone counts)."""
    if not started.is_file():
        return 0.0, 0
    record = json.loads(started.read_text())
    if record.get("fingerprint") != fingerprint:
        return 0.0, 0
    began = record.get("began", started.stat().st_mtime)
    ended = record.get("ended") or (log.stat().st_mtime if log.is_file() else began)
    return record.get("earlier_seconds", 0.0) + max(0.0, ended - began), record.get("earlier_runs", 0) + 1
