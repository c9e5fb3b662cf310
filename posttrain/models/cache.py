"""Where posttrain keeps files it derives once and reuses (dequantised models, tokenizers).

The root is ``$POSTTRAIN_CACHE`` if set, else ``~/.cache/posttrain``; models sit in
``<root>/models``. Every entry is written by :func:`build_atomically`: into a hidden temporary
directory beside the final one, then renamed into place, so a crash or a concurrent writer never
leaves a half-written entry where a reader would find it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$POSTTRAIN_CACHE`` or ``~/.cache/posttrain`` (not created here)."""
    configured = os.environ.get("POSTTRAIN_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "posttrain"


def models_cache_dir() -> Path:
    """``<cache_root>/models``: one sub-directory per derived model or tokenizer."""
    return cache_root() / "models"


def build_atomically(final_dir: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final_dir``, calling ``build(tmp_dir)`` to fill it first if it does not exist.

    ``build`` writes into an empty temporary directory on the same filesystem; on success the
    directory is renamed to ``final_dir`` in one step. If another process finished first, its
    entry wins and ours is discarded. On failure nothing is left behind.
    """
    if final_dir.is_dir():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        build(tmp_dir)
        # mkdtemp makes the directory private (0700); a cache entry is read by other processes.
        tmp_dir.chmod(0o755)
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            # A concurrent builder renamed its copy first (the target is a non-empty directory).
            if not final_dir.is_dir():
                raise
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir
