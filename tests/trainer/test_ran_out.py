"""A run whose data ends before ``total_steps`` (DAPO's dynamic sampling reads it faster than one batch a
step): its last step is validated (once) and checkpointed, and metrics.jsonl holds that validation. And a run whose
epochs are fewer batches than trainer.total_training_steps says so in its first line."""

import json
from types import SimpleNamespace

import pytest

from posttrain.config.schema import PosttrainConfig
from posttrain.trainer.run import Run, RunParts
from posttrain.trainer.tracking import Tracking


class CountingValidation:
    """A validation that records the steps it ran at, with the RL trainers' schedule."""

    before_training = False

    def __init__(self, test_freq: int) -> None:
        self.test_freq, self.steps, self.history, self.first_samples, self.last_samples = test_freq, [], [], [], []

    def due(self, step: int, total_steps: int) -> bool:
        return self.test_freq > 0 and (step % self.test_freq == 0 or step == total_steps)

    def __call__(self, roles, step: int) -> dict[str, float]:
        self.steps.append(step)
        self.history.append({"val/acc": float(step)})
        return {"val/acc": float(step)}


def run_out_of_data(tmp_path, batches: int, total_steps: int, test_freq: int, save_freq: int = -1) -> tuple[CountingValidation, list[int], list[dict]]:
    config = PosttrainConfig()
    config.trainer.default_local_dir, config.trainer.save_freq = str(tmp_path), save_freq
    validation = CountingValidation(test_freq)
    parts = RunParts(headline="test", config=config, total_steps=total_steps, step=lambda roles, item, step: {"loss": float(item)},
                     batches=lambda: iter([(0, index) for index in range(batches)]), validation=validation)
    run, saved = Run(parts), []

    def save_checkpoint():
        saved.append(run.step)
        run.saved_step = run.step

    run.save_checkpoint = save_checkpoint
    roles = SimpleNamespace(resident_memory=lambda: {})
    tracking = Tracking(["jsonl"], run_dir=tmp_path, project="p", experiment="e", total_steps=total_steps)
    try:
        run._loop(roles, tracking)
    finally:
        tracking.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return validation, saved, records


def test_the_last_step_is_validated_when_the_data_runs_out(tmp_path):
    validation, saved, records = run_out_of_data(tmp_path, batches=5, total_steps=8, test_freq=2)
    assert validation.steps == [2, 4, 5]  # every test_freq steps, then the last step the data allowed
    assert saved == [5]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 5]  # the step's own record, then its validation's
    assert records[-1]["metrics"] == {"val/acc": 5.0}
    assert records[-2]["metrics"]["loss"] == 4.0


@pytest.mark.parametrize("test_freq", [-1, 5])
def test_no_second_validation_when_validation_is_off_or_already_ran_at_that_step(tmp_path, test_freq):
    validation, saved, records = run_out_of_data(tmp_path, batches=5, total_steps=8, test_freq=test_freq)
    assert validation.steps == ([] if test_freq == -1 else [5])
    assert saved == [5] and [r["step"] for r in records] == [1, 2, 3, 4, 5]


def test_a_last_step_saved_by_save_freq_is_still_validated_and_saved_once(tmp_path):
    validation, saved, records = run_out_of_data(tmp_path, batches=5, total_steps=8, test_freq=3, save_freq=5)
    assert validation.steps == [3, 5] and saved == [5]
    assert records[-1]["step"] == 5 and records[-1]["metrics"] == {"val/acc": 5.0}


def test_the_first_line_says_when_the_epochs_cut_the_steps_asked_short():
    from posttrain.trainer.sync import train_headline

    config = PosttrainConfig()
    config.trainer.total_training_steps, config.trainer.total_epochs = 96, 1
    capped = train_headline(config, 95)
    assert ("95 steps (trainer.total_training_steps=96, but 1 epoch(s) of the training rows are 95 batches: "
            "raise trainer.total_epochs for more)") in capped
    assert "total_training_steps" not in train_headline(config, 96)  # as asked: nothing to say
    config.trainer.total_training_steps = None
    assert "total_training_steps" not in train_headline(config, 95)  # none asked: the epochs decide
