"""Checkpoint directories: ``<root>/global_step_N/`` and a ``latest`` pointer that never lies.

Writing step N:

1. everything goes into ``global_step_N.partial/`` (workers add their own sub-directories:
   ``actor/``, ``critic/``; the trainer its ``trainer_state.json`` and ``config.yaml``);
2. every file is fsynced, then ``manifest.json`` is written last: the step and every file with its
   size in bytes. A directory is *complete* when its manifest reads and every listed file is there
   with that size;
3. the directory is renamed to ``global_step_N/``, then ``latest_checkpointed_iteration.txt``
   (verl's file name) is replaced atomically to name N (each rename fsynced);
4. older steps beyond ``keep`` are deleted; never the step just written nor the one the pointer names.

Reading (:meth:`CheckpointManager.latest`): the step the pointer names, if complete. An empty or
unreadable pointer, or one naming a missing or incomplete directory, falls back to the newest
complete checkpoint with a warning (and to an error when there is none, rather than silently
training from scratch). A directory without a manifest was written before manifests existed: it is
accepted, with a warning, when the pointer or ``trainer.resume_mode`` names it, and never chosen as
a fallback (it cannot be told from a damaged one).

Resuming from step k (or starting from scratch, k = 0) abandons every checkpoint after k, the
branch of an earlier attempt: :meth:`CheckpointManager.abandon_after` moves them to
``<root>/abandoned/`` so none of them is taken for the latest again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from posttrain.errors import InputError, MissingFileError, PosttrainError

POINTER = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"  # written last: {"step": N, "files": {relative path: bytes}}
ABANDONED = "abandoned"  # <root>/abandoned/global_step_N: checkpoints after the step a run resumed from
ASYNC_STATE = "async_state.pt"  # an asynchronous run's buffer: the data read ahead and the units not yet trained
STEP_DIR = re.compile(r"^global_step_(\d+)$")

logger = logging.getLogger(__name__)


class CheckpointError(PosttrainError):
    """A checkpoint that cannot be used (incomplete, of another mode, not one at all); exit code 2."""

    exit_code = 2


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise InputError(f"trainer.max_ckpt_to_keep must be >= 1 or null (keep all), got {keep}")
        self.root = Path(root)
        self.keep = keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    # ---- writing ----------------------------------------------------------------------------

    def begin(self, step: int) -> Path:
        """An empty directory to write step ``step`` into; :meth:`commit` publishes it."""
        partial = self.root / f"global_step_{step}.partial"
        if partial.exists():
            shutil.rmtree(partial)  # left by a run killed while saving
        partial.mkdir(parents=True)
        return partial

    def commit(self, step: int) -> Path:
        partial, final = self.root / f"global_step_{step}.partial", self.step_dir(step)
        if not partial.is_dir():
            raise CheckpointError(f"commit({step}) without begin({step}): {partial} does not exist")
        write_manifest(partial, step)
        replaced = self.root / f"global_step_{step}.replaced"
        if final.exists():  # the same step saved again: the old copy stays whole until the new one is in place
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(final, replaced)
        os.replace(partial, final)
        _fsync(self.root)
        self._point_to(step)
        shutil.rmtree(replaced, ignore_errors=True)
        self._prune(step)
        return final

    def abandon_after(self, step: int) -> list[Path]:
        """Move every checkpoint after ``step`` to ``<root>/abandoned/`` and point at ``step`` (at
        nothing when that step is not here); returns where they went. A run continuing from ``step`` makes them a
        dead branch: they must not be taken for the latest, and are kept for a person to delete."""
        moved = []
        for later in [s for s in self.steps() if s > step]:
            target = self.root / ABANDONED / f"global_step_{later}"
            copy = 1
            while target.exists():  # abandoned before, at the same step
                copy += 1
                target = self.root / ABANDONED / f"global_step_{later}.{copy}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.step_dir(later), target)
            moved.append(target)
        here = self.step_dir(step).is_dir()
        if self._pointer_text() != (str(step) if here else None):
            if here:
                self._point_to(step)
            else:  # started from scratch, or from another run's checkpoint
                (self.root / POINTER).unlink(missing_ok=True)
        return moved

    def continue_from(self, directory: Path | None) -> int:
        """A run starting from ``directory`` (None: from scratch): the checkpoints after it move aside,
        saying so; returns the step it continues from (0 from scratch)."""
        step = step_of(directory) if directory is not None else 0
        moved = self.abandon_after(step)
        if moved:
            print(f"posttrain: continuing from step {step}, so the later checkpoints of an earlier attempt "
                  f"({', '.join(p.name for p in moved)}) were moved to {moved[0].parent}")
        return step

    # ---- reading ----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Every ``global_step_N`` directory's N, complete or not, in order."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())

    def complete_steps(self) -> list[int]:
        return [step for step in self.steps() if incomplete(self.step_dir(step)) is None]

    def latest(self) -> Path | None:
        """The checkpoint to resume from: the one the pointer names when it is complete, else the
        newest complete one (with a warning); None when nothing was ever checkpointed here."""
        text = self._pointer_text()
        if text is None:
            # No pointer: nothing saved yet, or a kill between the first step's rename and its pointer.
            complete = self.complete_steps()
            if not complete:
                return None
            logger.warning("posttrain: %s has no %s; resuming from the newest complete checkpoint, %s",
                           self.root, POINTER, self.step_dir(complete[-1]))
            return self.step_dir(complete[-1])
        if not (text.isascii() and text.isdigit()):
            return self._fall_back(f"{self.root / POINTER} is empty or unreadable ({text[:40]!r})")
        path = self.step_dir(int(text))
        reason = incomplete(path)
        if reason is None:
            return path
        if path.is_dir() and not (path / MANIFEST).exists():
            logger.warning("posttrain: %s has no %s (written before checkpoints had one); resuming from it as the pointer says",
                           path, MANIFEST)
            return path
        return self._fall_back(f"{self.root / POINTER} names step {text}, but {reason}")

    def resolve_resume(self, mode: str) -> Path | None:
        """``auto``: the latest checkpoint if any; ``disable``: none; otherwise a checkpoint directory path."""
        if mode == "disable":
            return None
        if mode == "auto":
            return self.latest()
        path = Path(mode)
        if not path.is_dir() or not STEP_DIR.match(path.name):
            raise CheckpointError(
                f"trainer.resume_mode={mode!r}: expected auto, disable, or a global_step_N directory that exists"
            )
        return checked_by_name(path, f"trainer.resume_mode={mode!r}")

    def name_the_resume(self, err: BaseException, step: int) -> None:
        """A dead or stuck worker ends a run; its message gets the step and what resumes the run.
        Nothing more is saved: the worker that died or hangs holds the weights (a save would wait
        on it), so the last committed checkpoint is the one to resume from."""
        latest = self.latest()
        resume = (f"resume from {latest} with trainer.resume_mode=auto (the same command again)" if latest else
                  "no checkpoint was written yet, so the same command starts over (trainer.save_freq=N saves every N steps)")
        err.args = (f"{err} The run stopped in step {step}; {resume}.",)

    # ---- internals --------------------------------------------------------------------------

    def _pointer_text(self) -> str | None:
        pointer = self.root / POINTER
        if not pointer.is_file():
            return None
        return pointer.read_bytes().decode("utf-8", errors="replace").strip()

    def _point_to(self, step: int) -> None:
        tmp_pointer = self.root / f"{POINTER}.tmp"
        with open(tmp_pointer, "w") as out:
            out.write(str(step))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp_pointer, self.root / POINTER)
        _fsync(self.root)

    def _fall_back(self, problem: str) -> Path:
        complete = self.complete_steps()
        if not complete:
            raise CheckpointError(
                f"{problem}, and no other checkpoint in {self.root} is complete: restore it, resume from a directory you "
                "trust (trainer.resume_mode=<path to global_step_N>), or start over (trainer.resume_mode=disable)"
            )
        path = self.step_dir(complete[-1])
        logger.warning("posttrain: %s; resuming from the newest complete checkpoint, %s", problem, path)
        return path

    def _prune(self, saved: int) -> None:
        """Older steps beyond ``keep``; the step just saved and the one the pointer names stay."""
        if self.keep is None:
            return
        text = self._pointer_text()
        pointer = int(text) if text is not None and text.isascii() and text.isdigit() else None
        older = [step for step in self.steps() if step < saved]
        doomed = [step for step in older if step != pointer]
        room = max(self.keep - 1 - (pointer in older), 0)  # the saved step counts, and the pointer's if older
        for step in doomed[: max(len(doomed) - room, 0)]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)


def write_manifest(directory: Path, step: int) -> dict[str, int]:
    """fsync every file under ``directory``, then write its manifest (fsynced too); returns the files."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        _fsync(path)
        files[path.relative_to(directory).as_posix()] = path.stat().st_size
    for sub in sorted({p.parent for p in directory.rglob("*")} | {directory}):
        _fsync(sub)  # the directory entries of the files just synced
    with open(directory / MANIFEST, "w") as out:
        json.dump({"step": step, "files": files}, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    _fsync(directory)
    return files


def checked_by_name(path: Path, named_by: str) -> Path:
    """A checkpoint a user named (``named_by`` says where): refused when its manifest says it is
    incomplete; one from before manifests is taken, with a warning."""
    reason = incomplete(path)
    if reason is not None and (path / MANIFEST).exists():
        raise CheckpointError(f"{named_by}: the checkpoint {path} is incomplete ({reason}); pick another step")
    if reason is not None:
        logger.warning("posttrain: %s has no %s (written before checkpoints had one); using it as %s says", path, MANIFEST, named_by)
    return path


def incomplete(directory: Path) -> str | None:
    """Why ``directory`` is not a complete checkpoint, or None when its manifest checks out."""
    if not directory.is_dir():
        return f"{directory} is missing"
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = dict(manifest["files"])
    except FileNotFoundError:
        return f"{directory} has no {MANIFEST}"
    except (ValueError, KeyError, TypeError):
        return f"{directory / MANIFEST} is unreadable"
    if STEP_DIR.match(directory.name) and manifest.get("step") != step_of(directory):
        return f"{directory / MANIFEST} is for step {manifest.get('step')}"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, the manifest says {size}"
    return None


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_of(path: Path) -> int:
    match = STEP_DIR.match(path.name)
    if not match:
        raise CheckpointError(f"{path} is not a global_step_N directory")
    return int(match.group(1))


def save_rng_state(directory: Path) -> None:
    """The controller's torch and numpy RNG states, beside a checkpoint's other files."""
    import numpy as np
    import torch

    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state()}, directory / "rng.pt")


def load_rng_state(directory: Path) -> None:
    import numpy as np
    import torch

    state = torch.load(directory / "rng.pt", weights_only=False)
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])


def checkpoint_dir(path: str | Path) -> Path:
    """A ``global_step_N`` directory, or a run directory (its latest checkpoint)."""
    path = Path(path)
    if (path / "actor").is_dir():
        return checked_by_name(path, "the checkpoint given")
    latest = CheckpointManager(path / "checkpoints").latest() or CheckpointManager(path).latest()
    if latest is None:
        raise MissingFileError(f"{path}: neither a global_step_N checkpoint nor a run directory with checkpoints")
    return latest
