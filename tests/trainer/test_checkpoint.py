"""The latest pointer only ever names a complete step; a damaged pointer or directory falls back to
the newest complete step; pruning and resuming never lose the step a run continues from."""

import json
import logging
import re

import pytest

from posttrain.trainer import checkpoint
from posttrain.trainer.checkpoint import MANIFEST, POINTER, CheckpointError, CheckpointManager, incomplete, step_of


def save(manager: CheckpointManager, step: int) -> None:
    partial = manager.begin(step)
    (partial / "state.txt").write_text(f"step {step}")
    (partial / "actor").mkdir()
    (partial / "actor" / "model.pt").write_bytes(bytes(10 * step))
    manager.commit(step)


def content(path) -> str:
    return (path / "state.txt").read_text()


def test_commit_writes_a_manifest_publishes_and_prunes(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.latest() is None and manager.resolve_resume("auto") is None
    for step in (1, 2, 3):
        save(manager, step)
    assert manager.steps() == [2, 3]
    assert manager.latest() == tmp_path / "global_step_3"
    assert content(manager.latest()) == "step 3"
    assert step_of(manager.latest()) == 3
    manifest = json.loads((tmp_path / "global_step_3" / MANIFEST).read_text())
    assert manifest == {"step": 3, "files": {"actor/model.pt": 30, "state.txt": 6}}


def test_a_kill_during_save_leaves_the_previous_step_as_latest(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    partial = manager.begin(2)
    (partial / "half").write_text("x")  # killed here: no commit
    again = CheckpointManager(tmp_path)
    assert again.latest() == tmp_path / "global_step_1"
    assert again.steps() == [1]
    save(again, 2)  # the next run overwrites the partial step
    assert again.latest() == tmp_path / "global_step_2" and not (tmp_path / "global_step_2" / "half").exists()


class Crash(Exception):
    pass


def fsync_calls_in_one_commit(tmp_path) -> int:
    calls = []
    manager = CheckpointManager(tmp_path / "count")
    save(manager, 1)
    real = checkpoint._fsync
    checkpoint._fsync = lambda path: (calls.append(path), real(path))
    try:
        save(manager, 2)
    finally:
        checkpoint._fsync = real
    return len(calls)


def test_a_crash_at_any_point_of_a_commit_leaves_a_complete_latest(tmp_path, monkeypatch):
    """The process dies at each fsync of committing step 2 in turn (before the files are synced,
    between the manifest and the rename, between the rename and the pointer, after the pointer):
    the next run always finds step 1 or step 2, complete, and saving step 2 again works."""
    real = checkpoint._fsync
    total = fsync_calls_in_one_commit(tmp_path)
    assert total >= 6  # two files, their directories, the manifest's directory, the root twice
    found = set()
    for crash_at in range(total):
        root = tmp_path / f"crash_{crash_at}"
        save(CheckpointManager(root), 1)
        calls = iter(range(total))

        def dying_fsync(path, crash_at=crash_at):
            if next(calls) == crash_at:
                raise Crash
            real(path)

        monkeypatch.setattr(checkpoint, "_fsync", dying_fsync)
        with pytest.raises(Crash):
            save(CheckpointManager(root), 2)
        monkeypatch.setattr(checkpoint, "_fsync", real)
        after = CheckpointManager(root)
        latest = after.latest()
        assert latest in (root / "global_step_1", root / "global_step_2") and incomplete(latest) is None
        assert content(latest) == f"step {step_of(latest)}"
        found.add(step_of(latest))
        save(after, 2)
        assert after.latest() == root / "global_step_2" and incomplete(root / "global_step_2") is None
    assert found == {1, 2}  # crashes before the rename keep step 1; after it, step 2 is whole and found


@pytest.mark.parametrize("pointer", [b"", b"  \n", b"2\x00\x00", b"global_step_2", b"\xff\xfe", "²".encode()])
def test_an_empty_or_corrupt_pointer_falls_back_to_the_newest_complete_step(tmp_path, caplog, pointer):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    save(manager, 2)
    (tmp_path / POINTER).write_bytes(pointer)
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_2"
    assert "empty or unreadable" in caplog.text and "newest complete checkpoint" in caplog.text


def test_a_damaged_directory_falls_back_and_a_manifestless_one_is_never_a_fallback(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        save(manager, step)
    (tmp_path / "global_step_3" / "actor" / "model.pt").write_bytes(b"cut")  # truncated after it was written
    (tmp_path / "global_step_2" / MANIFEST).unlink()
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_1"
    assert "names step 3, but" in caplog.text and "has 3 bytes, the manifest says 30" in caplog.text
    assert manager.complete_steps() == [1]
    with pytest.raises(CheckpointError, match="incomplete .*has 3 bytes"):
        manager.resolve_resume(str(tmp_path / "global_step_3"))  # asked for by name: refused, not replaced


def test_with_nothing_complete_a_broken_pointer_is_an_error_not_a_fresh_start(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 5)
    (tmp_path / "global_step_5").rename(tmp_path / "moved")
    with pytest.raises(CheckpointError, match=r"names step 5, but .*global_step_5 is missing.*trainer.resume_mode=disable"):
        manager.latest()
    (tmp_path / POINTER).write_text("")
    with pytest.raises(CheckpointError, match="empty or unreadable"):
        manager.latest()


def test_a_checkpoint_from_before_manifests_is_accepted_only_when_named(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    save(manager, 4)
    (tmp_path / "global_step_4" / MANIFEST).unlink()  # as written by an older posttrain
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_4"
        assert manager.resolve_resume(str(tmp_path / "global_step_4")) == tmp_path / "global_step_4"
    assert caplog.text.count("written before checkpoints had one") == 2
    (tmp_path / POINTER).unlink()
    assert manager.latest() is None  # no pointer and nothing complete: nothing to resume


def test_a_kill_between_the_first_rename_and_the_pointer_still_finds_the_step(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    (tmp_path / POINTER).unlink()
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == tmp_path / "global_step_1"
    assert f"has no {POINTER}" in caplog.text


def test_pruning_keeps_the_step_just_saved_even_beside_newer_ones(tmp_path):
    """Checkpoints 1..3 from an older posttrain that kept a resumed run's newer steps: saving step 2
    again with keep=1 used to delete it (only the newest step was kept)."""
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        save(manager, step)
    save(CheckpointManager(tmp_path, keep=1), 2)
    assert (tmp_path / "global_step_2").is_dir() and manager.latest() == tmp_path / "global_step_2"
    assert not (tmp_path / "global_step_1").exists()


def test_resuming_from_an_older_step_moves_the_newer_ones_aside(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        save(manager, step)
    moved = manager.abandon_after(2)
    assert moved == [tmp_path / "abandoned" / "global_step_3"] and content(moved[0]) == "step 3"
    assert manager.steps() == [2] and manager.latest() == tmp_path / "global_step_2"
    save(manager, 3)  # the new branch's step 3
    assert manager.abandon_after(2) == [tmp_path / "abandoned" / "global_step_3.2"]  # the earlier one is kept
    assert manager.abandon_after(0) == [tmp_path / "abandoned" / "global_step_2"]  # a fresh start
    assert manager.latest() is None and not (tmp_path / POINTER).exists()


def test_resume_modes(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 5)
    assert manager.resolve_resume("disable") is None
    assert manager.resolve_resume(str(tmp_path / "global_step_5")) == tmp_path / "global_step_5"
    with pytest.raises(CheckpointError, match="expected auto, disable"):
        manager.resolve_resume(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="max_ckpt_to_keep"):
        CheckpointManager(tmp_path, keep=0)


def test_export_of_a_run_whose_checkpoints_are_all_damaged_says_what_to_do(tmp_path, capsys):
    from posttrain.cli import main

    manager = CheckpointManager(tmp_path / "checkpoints")
    save(manager, 1)
    (tmp_path / "checkpoints" / "global_step_1" / "state.txt").write_text("cut")
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "names step 1, but" in err and "has 3 bytes, the manifest says 6" in err and "trainer.resume_mode" in err


@pytest.mark.parametrize(("options", "message"), [
    (["--toward", "MODEL"], "--toward MODEL needs --weight W"),
    (["--weight", "-0.5"], "--weight -0.5: give a finite number, 0 or above: 0 is the model trained from"),
    (["--weight", "nan"], "--weight nan: give a finite number"),
    (["--toward", "{tmp}/nowhere", "--weight", "0.5"], "--toward .*nowhere: .*neither a built-in model"),
    (["--average", "0"], "--average 0: give how many"),
])
def test_export_toward_a_model_refuses_what_it_cannot_use_before_reading_the_checkpoint(tmp_path, capsys, options, message):
    from posttrain.cli import main

    # tmp_path holds no checkpoint: each refusal comes before the checkpoint is looked for
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "hf"), *(o.format(tmp=tmp_path) for o in options)]) == 2
    assert re.search(message, capsys.readouterr().err, re.I | re.S)


def test_export_takes_a_weight_above_one_and_goes_on_to_look_for_the_checkpoint(tmp_path, capsys):
    from posttrain.cli import main

    # W 1.5 carries the policy past itself (ExPO): not refused, so the export looks for the checkpoint tmp_path lacks
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "hf"), "--weight", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "finite number" not in err and "global_step_N" in err


def test_export_of_an_average_of_more_checkpoints_than_the_run_keeps_says_which_it_keeps(tmp_path, capsys):
    from posttrain.cli import main

    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    for step in (4, 8, 12):
        save(manager, step)  # the third prunes step 4
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "hf"), "--average", "3"]) == 2
    err = capsys.readouterr().err
    assert "--average 3:" in err and "keeps 2 complete checkpoint(s) up to step 12 (steps 8, 12): average 2 or fewer" in err and "max_ckpt_to_keep" in err


def _run_of(directory, model: str, *steps: int, lora_rank: int = 0):
    """A run directory with complete checkpoints at ``steps`` (2 if none) whose config says it was trained from
    ``model`` (with LoRA of ``lora_rank``)."""
    manager = CheckpointManager(directory / "checkpoints")
    for step in steps or (2,):
        partial = manager.begin(step)
        (partial / "actor").mkdir()
        (partial / "actor" / "model.pt").write_bytes(bytes(10))
        (partial / "config.yaml").write_text(f"actor_rollout_ref:\n  model:\n    path: {model}\n    lora_rank: {lora_rank}\n")
        manager.commit(step)
    return directory


@pytest.mark.parametrize(("others", "message"), [
    (["{tmp}/b"], ("--with .*b: that run was trained from .*other_model, the checkpoint given from .*the_model: average runs "
                   "that started from the same model")),
    (["{tmp}/lora"], "--with .*lora: that run trained LoRA rank 4 on all-linear, the checkpoint given rank 0"),
    (["{tmp}/a"], "the checkpoint .*global_step_2 would be in the mean twice"),
    (["{tmp}/nowhere"], "--with .*nowhere: .*neither a global_step_N checkpoint nor a run directory"),
])
def test_export_with_other_runs_refuses_another_model_the_same_run_twice_and_no_run(tmp_path, capsys, others, message):
    from posttrain.cli import main

    _run_of(tmp_path / "a", str(tmp_path / "the_model"))
    _run_of(tmp_path / "b", str(tmp_path / "other_model"), 3)
    _run_of(tmp_path / "lora", str(tmp_path / "the_model"), 3, lora_rank=4)
    options = [o for other in others for o in ("--with", other.format(tmp=tmp_path))]
    assert main(["export", str(tmp_path / "a"), "--out", str(tmp_path / "hf"), *options]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.DOTALL) and "the mean of" not in err  # refused before the mean is announced


def test_export_with_average_takes_each_runs_last_k_and_the_same_model_written_otherwise(tmp_path, capsys, monkeypatch):
    from posttrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "the_model").mkdir()
    _run_of(tmp_path / "a", str(tmp_path / "the_model"), 2, 4, 6)
    _run_of(tmp_path / "b", "the_model", 3, 5)  # relative, from the directory the export runs in: the same model
    _run_of(tmp_path / "c", "the_model", 7)
    # the mean is announced, then loading the stand-in model fails: the checkpoints the mean would take are the point
    assert main(["export", str(tmp_path / "a"), "--out", "hf", "--average", "2", "--with", "b"]) != 0
    assert f"the mean of steps 4, 6 of {tmp_path / 'a'}; steps 3, 5 of b" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "a"), "--out", "hf", "--average", "2", "--with", "c"]) == 2
    err = capsys.readouterr().err
    assert "--average 2:" in err and "keeps 1 complete checkpoint(s) up to step 7" in err
