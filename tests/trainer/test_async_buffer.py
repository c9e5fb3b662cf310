"""The unit scheduler between generators and the trainer: the staleness bound holds for every unit
whatever order generators finish in, the buffer bound blocks producers, a dead generator's unit is
generated again, and a snapshot taken mid-run resumes without training any unit twice or skipping
a prompt."""

import random
import threading

import pytest
import torch

from posttrain import keys
from posttrain.protocol import Batch
from posttrain.trainer.async_.buffer import SchedulerClosed, UnitScheduler
from posttrain.rollout.generator import GeneratedUnit

PROMPTS_PER_BATCH = 4


def prompt_batches(count: int):
    """Batches of prompts whose UID says which prompt they are (batch.row)."""
    batches = iter([
        Batch.from_dict({keys.PROMPT_IDS: torch.arange(PROMPTS_PER_BATCH).unsqueeze(1) + 10 * b},
                        {keys.UID: [f"{b}.{r}" for r in range(PROMPTS_PER_BATCH)]})
        for b in range(count)
    ])
    return lambda: next(batches, None)


def scheduler(*, staleness: int, batches: int = 6, groups_per_unit: int = 2, capacity_units: int | None = None, data=None):
    units_per_batch = PROMPTS_PER_BATCH // groups_per_unit
    return UnitScheduler(
        units_per_batch=units_per_batch, groups_per_unit=groups_per_unit, group_size=3,
        capacity_units=capacity_units or (staleness + 1) * units_per_batch, max_staleness=staleness,
        total_batches=batches, next_prompts=data or prompt_batches(batches),
    )


def run(s: UnitScheduler, generators: int, steps: int, seed: int, start_step: int = 0):
    """Generator threads that finish units after random delays, the trainer taking batches in turn;
    returns (step, lag, uids) per trained unit."""
    rng = random.Random(seed)
    versions = {"published": s.version}

    def generate():
        while (unit := s.next_unit()) is not None:
            version = versions["published"]  # a generator starts with the newest published weights
            threading.Event().wait(rng.random() * 0.01)
            s.finish(unit, GeneratedUnit(unit.index, version, unit.prompts, {}, 0.0))

    threads = [threading.Thread(target=generate, daemon=True) for _ in range(generators)]
    for thread in threads:
        thread.start()
    trained = []
    for step in range(start_step, steps):
        for unit in s.take_batch(step):
            trained.append((step, step - unit.version, list(unit.batch[keys.UID])))
        versions["published"] = step + 1
        s.advance(step + 1)
    s.close()
    for thread in threads:
        thread.join(timeout=5)
    return trained


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_no_unit_is_trained_above_the_bound_and_every_prompt_once_in_order(staleness, seed):
    trained = run(scheduler(staleness=staleness), generators=3, steps=6, seed=seed)
    assert max(lag for _, lag, _ in trained) <= staleness
    uids = [uid for _, _, unit_uids in trained for uid in unit_uids]
    assert uids == [f"{b}.{r}" for b in range(6) for r in range(PROMPTS_PER_BATCH)]  # data order, none twice, none skipped


def test_staleness_zero_is_synchronous():
    trained = run(scheduler(staleness=0), generators=3, steps=4, seed=0)
    assert {lag for _, lag, _ in trained} == {0}


def test_staleness_one_lets_generators_run_one_batch_ahead():
    s = scheduler(staleness=1, batches=4, capacity_units=10)  # only the staleness bound can block here
    started = [s.next_unit() for _ in range(4)]  # batch 0 and batch 1, without any update yet
    assert [u.batch_index for u in started] == [0, 0, 1, 1]
    assert [u.row_offset for u in started] == [0, 6, 0, 6]  # 2 prompts × group of 3 per unit
    blocked = threading.Thread(target=lambda: started.append(s.next_unit()), daemon=True)
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive(), "batch 2 must wait for version 1"
    s.advance(1)
    blocked.join(timeout=2)
    assert started[-1].batch_index == 2
    s.close()


def test_a_full_buffer_blocks_producers_and_nothing_is_dropped():
    s = scheduler(staleness=5, capacity_units=2)
    first, second = s.next_unit(), s.next_unit()
    waiting = []
    blocked = threading.Thread(target=lambda: waiting.append(s.next_unit()), daemon=True)
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive() and s.status()["async/in_flight_units"] == 2
    for unit in (first, second):
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    assert blocked.is_alive(), "finished but untrained units still fill the buffer"
    assert len(s.take_batch(0)) == 2
    blocked.join(timeout=2)
    assert waiting[0].index == 2
    s.close()


def test_a_dead_generators_unit_is_generated_again_first():
    s = scheduler(staleness=1)
    lost, other = s.next_unit(), s.next_unit()
    s.requeue(lost)
    again = s.next_unit()
    assert again.index == lost.index and s.status()["async/requeued_units"] == 1
    assert list(again.prompts[keys.UID]) == list(lost.prompts[keys.UID])
    for unit in (again, other):
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    assert [u.index for u in s.take_batch(0)] == [0, 1]
    s.close()


def test_a_unit_above_the_bound_is_dropped_counted_and_generated_again():
    s = scheduler(staleness=0)
    first, second = s.next_unit(), s.next_unit()
    s.finish(first, GeneratedUnit(first.index, 0, first.prompts, {}, 0.0))
    s.finish(second, GeneratedUnit(second.index, -1, second.prompts, {}, 0.0))  # from weights older than admission allows
    taken = []
    trainer = threading.Thread(target=lambda: taken.extend(s.take_batch(0)), daemon=True)
    trainer.start()
    again = s.next_unit()
    assert again.index == second.index and s.status()["async/stale_dropped"] == 1
    s.finish(again, GeneratedUnit(again.index, 0, again.prompts, {}, 0.0))
    trainer.join(timeout=2)
    assert [u.version for u in taken] == [0, 0]
    s.close()


def test_closing_wakes_a_waiting_trainer_with_the_reason():
    s = scheduler(staleness=1)
    s.close(RuntimeError("generator 0 failed"))
    with pytest.raises(SchedulerClosed, match="generator 0 failed"):
        s.take_batch(0)
    assert s.next_unit() is None


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_a_snapshot_resumes_without_training_a_unit_twice_or_skipping_a_prompt(stop_after):
    batches = 6
    data_position = {"next": 0}
    source = prompt_batches(batches)

    def counting_source():
        batch = source()
        if batch is not None:
            data_position["next"] += 1
        return batch

    s = scheduler(staleness=2, batches=batches, data=counting_source)
    before = run_until(s, stop_after)
    state = s.snapshot(lambda: dict(data_position))
    s.close()

    # resume: a fresh scheduler at the stopped version, the data source from the saved position
    remaining = prompt_batches(batches)
    for _ in range(state["data"]["next"]):
        remaining()
    resumed = scheduler(staleness=2, batches=batches, data=remaining)
    resumed.version = stop_after
    resumed.restore(state)
    after = run(resumed, generators=2, steps=batches, seed=1, start_step=stop_after)
    uids = [uid for _, _, unit_uids in before + after for uid in unit_uids]
    assert uids == [f"{b}.{r}" for b in range(batches) for r in range(PROMPTS_PER_BATCH)]
    assert max(lag for _, lag, _ in before + after) <= 2


def run_until(s: UnitScheduler, steps: int):
    """Generate greedily (every admissible unit, finished at once), train ``steps`` batches."""
    trained = []
    for step in range(steps):
        while True:
            unit = next_now(s)
            if unit is None:
                break
            s.finish(unit, GeneratedUnit(unit.index, s.version, unit.prompts, {}, 0.0))
        for unit in s.take_batch(step):
            trained.append((step, step - unit.version, list(unit.batch[keys.UID])))
        s.advance(step + 1)
    unit = next_now(s)  # one unit in flight at the snapshot: it must come back as prompts
    assert unit is not None
    return trained


def next_now(s: UnitScheduler):
    with s._condition:
        unit = s._admit()
        if unit is not None:
            s.in_flight[unit.index] = unit
        return unit


def test_a_dynamic_sampling_round_goes_first_is_returned_on_a_failure_and_is_never_checkpointed():
    """Batch 0 is taken; its step asks one more round (the data's next prompts, tagged batch 0):
    those units start before any read-ahead unit, are taken as batch 0's, and (taken or not) are
    never in a snapshot; the batch's own units, put back after a failure, are."""
    s = scheduler(staleness=1, batches=3, data=prompt_batches(4))  # one batch of data more than the run's steps
    unit = s.next_unit()
    s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    unit = s.next_unit()
    s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    taken = s.take_batch(0)
    assert [u.index for u in taken] == [0, 1]
    regular = list(s.taken)
    extra = s.add_round(0)  # the next prompts of the data: batch 1's (nothing was read ahead yet)
    assert extra == [6, 7]  # numbered after the run's 3 × 2 regular units
    first = s.next_unit()
    assert (first.index, first.batch_index, first.extra) == (6, 0, True)  # before batch 1's read-ahead
    assert first.row_offset == 2 * 2 * 3  # rows after the batch's own 2 units of 2 groups of 3
    s.finish(first, GeneratedUnit(first.index, 0, first.prompts, {}, 0.0))
    snapshot = s.snapshot(lambda: {})
    assert all(not u.extra for u in snapshot["unstarted"]) and all(not u.extra for u, _ in snapshot["finished"])
    s.put_back(regular)  # the step failed before training: batch 0's own units go back, finished
    assert sorted(s.finished) == [0, 1, 6]
    assert [u.index for u, _ in s.snapshot(lambda: {})["finished"]] == [0, 1]
    assert [u.batch_index for u in s.snapshot(lambda: {})["unstarted"]] == []  # the extra unit 7 is left out


def test_when_dynamic_sampling_has_read_the_data_the_next_batch_ends_the_run():
    from posttrain.trainer.stopping import DataRanOut

    s = scheduler(staleness=0, batches=2, data=prompt_batches(2))
    for _ in range(2):
        unit = s.next_unit()
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    s.take_batch(0)
    assert s.add_round(0) == [4, 5]  # batch 1's prompts, read as batch 0's second round
    assert s.add_round(0) is None  # nothing left
    s.advance(1)
    with pytest.raises(DataRanOut, match="no prompts are left for batch 1"):
        s.take_batch(1)


def test_a_dynamic_sampling_round_is_admitted_even_when_the_buffer_is_full():
    """The buffer holds one batch (2 units): once batch 0 is taken, batch 1's read-ahead fills it;
    the round the trainer then asks for still starts (the trainer waits on it), so nothing hangs."""
    s = scheduler(staleness=1, batches=4, capacity_units=2, data=prompt_batches(6))
    for _ in range(2):
        unit = s.next_unit()
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    s.take_batch(0)
    for _ in range(2):  # batch 1, read ahead, fills the buffer
        unit = s.next_unit()
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    assert sorted(s.finished) == [2, 3]
    indices = s.add_round(0)
    for _ in indices:
        unit = s.next_unit()
        assert unit.extra
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, {}, 0.0))
    assert [u.index for u in s.take_units(0, indices)] == indices


def test_a_checkpoints_buffer_cut_differently_is_refused_with_the_keys_to_keep():
    from posttrain.errors import InputError

    saved = scheduler(staleness=1, groups_per_unit=2)
    state = saved.snapshot(lambda: {})
    saved.close()
    resumed = scheduler(staleness=1, groups_per_unit=1)  # async.unit_groups changed between the runs
    with pytest.raises(InputError, match="resume with the same data.train_batch_size, actor_rollout_ref.rollout.n, async.num_generators"):
        resumed.restore(state)
    resumed.close()


def test_a_buffer_written_before_typed_metrics_is_refused_on_resume():
    from posttrain.errors import InputError
    from posttrain.metrics import total

    def buffer_with_a_finished_unit(metrics):
        s = scheduler(staleness=1)
        unit = next_now(s)
        s.finish(unit, GeneratedUnit(unit.index, 0, unit.prompts, metrics, 0.0))
        state = s.snapshot(lambda: {})
        s.close()
        return state

    fresh = scheduler(staleness=1)
    fresh.restore(buffer_with_a_finished_unit({"reward/samples": total(4)}))  # as written now
    fresh.close()
    old = scheduler(staleness=1)
    with pytest.raises(InputError, match="written before metrics carried their merge rule"):
        old.restore(buffer_with_a_finished_unit({"reward/samples": 4.0}))  # plain floats: an older posttrain's
    old.close()


def test_a_generator_that_keeps_dying_is_restarted_at_most_max_restarts_times_then_stops_the_run(monkeypatch):
    """Each death within the limit spawns a replacement (its unit goes back in line); one past it closes
    the scheduler with a GeneratorFailure naming how often it died."""
    import threading

    from rich.console import Console

    from posttrain.trainer.async_ import coordinator

    closed, spawned = [], []
    monkeypatch.setattr(coordinator, "kill_group", lambda group: None)
    pool = object.__new__(coordinator.Generators)
    pool._lock, pool.stopping, pool.restarts, pool.restarts_of, pool.groups = threading.Lock(), False, 0, [0, 0], ["g0", "g1"]
    pool.scheduler = type("Scheduler", (), {"close": lambda self, error: closed.append(error)})()
    pool.console = Console(quiet=True)
    pool._spawn = lambda i: spawned.append(i) or f"g{i}-new"
    pool._write_pids = lambda: None
    assert [pool._replace(1, RuntimeError("out of memory")) for _ in range(coordinator.MAX_RESTARTS)] == [True] * coordinator.MAX_RESTARTS
    assert spawned == [1] * coordinator.MAX_RESTARTS and closed == []
    assert pool._replace(1, RuntimeError("out of memory")) is False
    assert isinstance(closed[0], coordinator.GeneratorFailure)
    assert f"generator 1 died {coordinator.MAX_RESTARTS + 1} times; the last: out of memory" in str(closed[0])
    assert pool.restarts_of == [0, coordinator.MAX_RESTARTS + 1]
