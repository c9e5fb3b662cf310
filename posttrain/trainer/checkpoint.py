"""Checkpoint directories: ``<root>/global_step_N/`` and a ``latest`` pointer that never lies.

A step is written into ``global_step_N.partial/`` (workers add their own sub-directories: ``actor/``,
``critic/``; the trainer its ``trainer_state.json`` and ``config.yaml``), then renamed into place and
only then named in ``latest_checkpointed_iteration.txt`` (verl's file name), itself replaced
atomically. A kill at any moment leaves either the previous checkpoint or the new one as latest,
never a half-written one. Older steps beyond ``keep`` are deleted after the pointer moves.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

POINTER = "latest_checkpointed_iteration.txt"
ASYNC_STATE = "async_state.pt"  # an asynchronous run's buffer: the data read ahead and the units not yet trained
STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    pass


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"trainer.max_ckpt_to_keep must be >= 1 or null (keep all), got {keep}")
        self.root = Path(root)
        self.keep = keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

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
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        tmp_pointer = self.root / f"{POINTER}.tmp"
        tmp_pointer.write_text(str(step))
        os.replace(tmp_pointer, self.root / POINTER)
        self._prune()
        return final

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir())

    def latest(self) -> Path | None:
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        step = int(pointer.read_text().strip())
        path = self.step_dir(step)
        if not path.is_dir():
            raise CheckpointError(f"{pointer} names step {step} but {path} is missing; delete the pointer or restore the directory")
        return path

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
        return path

    def _prune(self) -> None:
        if self.keep is None:
            return
        for step in self.steps()[: -self.keep]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)


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
