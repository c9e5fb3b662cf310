"""build_atomically: builds once, never leaves a partial entry, lets a concurrent winner win."""

from pathlib import Path

import pytest

from posttrain.models.cache import build_atomically, cache_root, models_cache_dir


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert models_cache_dir() == tmp_path / "c" / "models"
    monkeypatch.delenv("POSTTRAIN_CACHE")
    assert cache_root() == Path.home() / ".cache" / "posttrain"


def test_builds_once_then_reuses(tmp_path):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "weights.bin").write_text("w")

    final = tmp_path / "entry"
    assert build_atomically(final, build) == final
    assert build_atomically(final, build) == final
    assert len(calls) == 1
    assert calls[0] != final  # built elsewhere, then renamed into place
    assert (final / "weights.bin").read_text() == "w"
    assert final.stat().st_mode & 0o777 == 0o755


def test_failed_build_leaves_nothing(tmp_path):
    def build(out: Path) -> None:
        (out / "half.bin").write_text("partial")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError, match="crash mid-write"):
        build_atomically(tmp_path / "entry", build)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_winner_is_kept(tmp_path):
    final = tmp_path / "entry"

    def build(out: Path) -> None:
        (out / "mine.txt").write_text("loser")
        final.mkdir()  # another process finishes first
        (final / "theirs.txt").write_text("winner")

    assert build_atomically(final, build) == final
    assert sorted(p.name for p in final.iterdir()) == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
