"""What a recipe does with a stage directory whose command changed: a train stage whose only change is more steps
(or epochs) trains further from its checkpoint, as ``posttrain train`` does with the same directory; any other
change starts the stage over, its old directory moved aside (:func:`start_over_or_further`)."""

from __future__ import annotations

import hashlib
import shlex
import time
from pathlib import Path

# a train stage's settings that, raised and nothing else changed, train its run further rather than start it over
MORE_STEPS = ("trainer.total_training_steps", "trainer.total_epochs")


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
