"""The latest pointer only ever names a complete step; old steps are pruned after it moves."""

import pytest

from posttrain.trainer.checkpoint import CheckpointError, CheckpointManager, step_of


def save(manager: CheckpointManager, step: int) -> None:
    partial = manager.begin(step)
    (partial / "state.txt").write_text(f"step {step}")
    manager.commit(step)


def test_commit_publishes_and_prunes(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.latest() is None and manager.resolve_resume("auto") is None
    for step in (1, 2, 3):
        save(manager, step)
    assert manager.steps() == [2, 3]
    assert manager.latest() == tmp_path / "global_step_3"
    assert (manager.latest() / "state.txt").read_text() == "step 3"
    assert step_of(manager.latest()) == 3


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


def test_resume_modes(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 5)
    assert manager.resolve_resume("disable") is None
    assert manager.resolve_resume(str(tmp_path / "global_step_5")) == tmp_path / "global_step_5"
    with pytest.raises(CheckpointError, match="expected auto, disable"):
        manager.resolve_resume(str(tmp_path / "nope"))
    (tmp_path / "global_step_5").rename(tmp_path / "moved")
    with pytest.raises(CheckpointError, match="names step 5"):
        manager.latest()
    with pytest.raises(ValueError, match="max_ckpt_to_keep"):
        CheckpointManager(tmp_path, keep=0)
