"""Asynchronous training overlaps generation with learning: the point of ``trainer.mode=async``.

The run records who worked when (``<run dir>/timeline.jsonl``: each step's learning interval and each
unit's generation interval, wall-clock). A trainer that generated and then trained in turns would
show no generation inside any learning interval; this test fails then."""

import json

import pytest

from tests.e2e.cli_runs import run
from tests.e2e.test_async_cli import command

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def overlap_s(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def test_generators_produce_while_the_trainer_learns(tmp_path):
    # 16 prompts in batches of 4: 4 steps; one generator, which may run one version ahead of the trainer
    done = run(command(tmp_path, "data.builtin_options.train_size=16", "trainer.total_training_steps=4",
                       "async.max_staleness=1", "async.num_generators=1", "trainer.val_before_train=false", "trainer.test_freq=-1"))
    assert done.returncode == 0, done.stdout[-4000:]
    steps = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    learning = [tuple(s["learn"]) for s in steps]
    generating = [tuple(u["interval"]) for s in steps for u in s["units"]]
    assert all(end > start for start, end in learning + generating)
    # a unit of a later batch is generated while an earlier batch is learned from
    overlapping = sum(overlap_s(g, l) for g in generating for l in learning)
    assert overlapping > 0, f"generation {generating} never overlapped learning {learning}"
