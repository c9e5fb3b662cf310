"""The asynchronous mode: generators produce groups while the trainer updates (``trainer.mode=async``).

    feed          the unit scheduler (the bounded buffer), the weight board and N generators (each in
                  a pool of its own, which the mode adds to the run's workers), opened once the
                  trainer's roles are up and restored; the starting weights are published. The feed
                  is the run's batch source: batch b is taken from the buffer when the skeleton asks
                  for the next item (its units in data order, each ≤ max_staleness versions old),
                  and the source ends when the data ran out (dynamic sampling read it ahead)
    each step     join batch b's units (with ``algorithm.filter_groups``, more rounds of the data's next
                  prompts for batch b until enough groups' rewards vary) → learn (π_prox = the trainer's logprobs before the update; π_ref,
                  values, advantages; critic and actor updates with the decoupled-PPO correction
                  against the behaviour logprobs) → publish version b + 1: one object in Ray's
                  object store, or a broadcast to the generators' group (``async.weight_transport``;
                  NCCL on GPUs) → the generators load it before their next unit
    validation    on the trainer's own rollout engine, synced just before
    checkpoints   the skeleton's, plus the scheduler's snapshot (``async_state.pt``): the data
                  position and every unit not yet trained (finished ones as generated, the rest as
                  prompts)
    stopping      the skeleton's: a stop (also while waiting for a batch) closes the feed — the
                  in-flight units are abandoned, their prompts are in the checkpoint — then checkpoints

The loop, validation, checkpoints, tracking and stopping are the run skeleton's (trainer/run.py)
and learning is the sync mode's (trainer/learn.py); this file holds where the batch comes from and
how the weights travel. Each step's generator and trainer intervals go to ``<run dir>/timeline.jsonl``,
which shows whether generation and training overlapped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.errors import ProcessLost
from posttrain.metrics import Metrics, merge, values
from posttrain.protocol import Batch
from posttrain.rollout import Rollout, group_ids_of, join_rollouts
from posttrain.rollout.generator import GeneratedUnit, WeightBoard
from posttrain.rollout.groups import dynamic_sample, update_batch_shape
from posttrain.timing import timed
from posttrain.trainer.async_.buffer import SchedulerClosed, UnitScheduler
from posttrain.trainer.async_.coordinator import Generators, generator_config, generator_pools, retriever_urls
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakers
from posttrain.trainer.checkpoint import ASYNC_STATE, step_of
from posttrain.trainer.data_setup import CurriculumTracker, curriculum_tracker
from posttrain.trainer.learn import Learner
from posttrain.trainer.roles import WORKER_ENV, ModeWorkers, Roles, uses_gpu
from posttrain.trainer.setup import RolloutSetup, rollout_services
from posttrain.trainer.run import RunParts, epoch_batches
from posttrain.trainer.stopping import CheckpointThenStop, DataRanOut, StopSignal
from posttrain.trainer.sync import batch_metrics, train_headline
from posttrain.trainer.validation import RLValidation

TIMELINE = "timeline.jsonl"


class GeneratorsFailed(CheckpointThenStop):
    """The generators stopped the run (a bug, an environment error, a generator that kept dying, the
    weight board gone); the trainer's state is checkpointed first."""


class WeightBoardLost(ProcessLost):
    """The weight board died or hung after the trainer's update: no checkpoint (the update is done,
    its version not published), so the run goes back to the last complete one."""


@dataclass
class FedBatch:
    """What the feed yields for a step: its batch's units, and the seconds the trainer waited for them."""

    units: list[GeneratedUnit]
    wait_s: float


class GeneratorFeed:
    """The run's generators and their buffer: the batch source, a service (opened after the resume), a
    checkpoint file (the buffer's snapshot) and the weight publisher."""

    def __init__(self, config: PosttrainConfig, setup: RolloutSetup) -> None:
        self.config, self.setup, self.loader = config, setup, setup.data.train
        options, batch = config.async_, config.data.train_batch_size
        self.groups_per_unit = options.unit_groups or max(1, batch // options.num_generators)
        if batch % self.groups_per_unit:
            self.groups_per_unit = batch  # a batch that does not split evenly goes to one generator at a time
        self.units_per_batch = batch // self.groups_per_unit
        capacity_groups = options.buffer_size or (options.max_staleness + 1) * batch
        self.capacity_units = max(self.units_per_batch, capacity_groups // self.groups_per_unit)
        self.pools = generator_pools(config)
        self.restored: dict | None = None
        self.first_batch = 0  # the batch the run's next step trains: the resumed step's
        self.scheduler: UnitScheduler | None = None
        self.generators: Generators | None = None
        self.board = None

    # ---- a checkpoint file ----------------------------------------------------------------------

    def save(self, path: Path) -> None:
        torch.save(self.scheduler.snapshot(self.loader.state_dict), path)

    def load(self, path: Path) -> None:
        self.restored = torch.load(path, weights_only=False)  # taken by open, which builds the scheduler

    # ---- a service ------------------------------------------------------------------------------

    def open(self, roles: Roles, resumed: Path | None) -> None:
        """The scheduler (with a resumed run's buffer), the weight board, the generators."""
        import ray

        version = self.first_batch = step_of(resumed) if resumed is not None else 0
        if resumed is None:
            (Path(self.config.trainer.default_local_dir) / TIMELINE).unlink(missing_ok=True)
        self.scheduler = self._new_scheduler(version)
        if self.restored is not None:
            self.loader.load_state_dict(self.restored["data"])  # where the generators had read to
            self.scheduler.restore(self.restored)
            self.restored = None
        self.board = ray.remote(WeightBoard).options(num_cpus=0).remote()
        self.generators = Generators(
            generator_config(self.config, retriever_urls(self.setup.rollout)), self.setup.data.data_dir, self.scheduler, self.board, roles.actor,
            roles.env_llm, [roles.pools.pool_of(pool.name) for pool in self.pools], Path(self.config.trainer.default_local_dir),
            WORKER_ENV, on_gpu=uses_gpu(self.config.trainer.device),
        )
        self.generators.start()
        self.publish(roles, version)  # a resumed run's weights reach the generators before any unit starts
        self.generators.serve()

    def close(self) -> None:
        if self.generators is not None:
            self.generators.stop()
        if self.board is not None:
            import ray

            ray.kill(self.board)
            self.board = None

    def _new_scheduler(self, version: int) -> UnitScheduler:
        batches = epoch_batches(self.loader, self.config.trainer.total_epochs)  # read ahead by the generators

        def next_prompts() -> Batch | None:
            return next((batch for _, batch in batches), None)

        return UnitScheduler(
            units_per_batch=self.units_per_batch, groups_per_unit=self.groups_per_unit,
            group_size=self.config.actor_rollout_ref.rollout.n, capacity_units=self.capacity_units,
            max_staleness=self.config.async_.max_staleness, total_batches=self.setup.total_steps, next_prompts=next_prompts,
            version=version,
        )

    # ---- batches in, weights out ----------------------------------------------------------------

    def batches(self, stop: StopSignal) -> Iterator[tuple[None, FedBatch]]:
        """The run's batch source, from the resumed step's batch on (read once the feed is open): each
        batch as it is taken from the buffer. Ends when no data is left for the next batch (dynamic
        sampling read it ahead), as an epoch stream ends."""
        index = self.first_batch
        while True:
            start = time.perf_counter()
            try:
                units = self.take_batch(index, stop)
            except DataRanOut:
                return
            yield None, FedBatch(units, time.perf_counter() - start)
            index += 1

    def take_batch(self, batch_index: int, stop: StopSignal) -> list[GeneratedUnit]:
        """Batch ``batch_index``'s units; while waiting, a stop asked for ends the wait and a replaced
        generator gets the current weights."""
        return self._take(batch_index, stop, lambda waiting: self.scheduler.take_batch(batch_index, while_waiting=waiting))

    def take_round(self, batch_index: int, stop: StopSignal) -> list[GeneratedUnit] | None:
        """Dynamic sampling: one more batch of the data's prompts generated for batch ``batch_index``
        (its units start before any other); None when the data has run out."""
        indices = self.scheduler.add_round(batch_index)
        if indices is None:
            return None
        return self._take(batch_index, stop, lambda waiting: self.scheduler.take_units(batch_index, indices, while_waiting=waiting))

    def _take(self, batch_index: int, stop: StopSignal, take) -> list[GeneratedUnit]:
        def while_waiting() -> None:
            stop.check(batch_index)
            self.generators.maintain(batch_index)

        try:
            return take(while_waiting)
        except SchedulerClosed as err:
            raise GeneratorsFailed(f"the generators stopped the run: {err}.") from err

    def publish(self, roles: Roles, version: int) -> None:
        """The trainer's weights as ``version`` (updates done), for the generators to load."""
        import ray

        if version > 0:
            if self.generators.collective:
                self.generators.broadcast(version)
                refs = []
            else:
                refs = roles.actor.publish_weights(version)[0]
            try:
                ray.get(self.board.publish.remote(version, refs), timeout=self.config.trainer.call_timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                raise WeightBoardLost(f"the weight board (the actor that tells generators the newest version) did not take "
                                      f"version {version} ({type(err).__name__}).") from err
        self.scheduler.advance(version)


class AsyncStep:
    """join the units the feed took from the buffer → learn → publish, timed (the wait for the
    units, in the batch source, is ``timing_s/wait_buffer`` and part of ``timing_s/step``)."""

    def __init__(self, config: PosttrainConfig, feed: GeneratorFeed, rollout: Rollout, learner: Learner,
                 breakers: CircuitBreakers, pad_token_id: int, stop: StopSignal, curriculum: CurriculumTracker | None = None) -> None:
        self.feed, self.rollout, self.learner, self.breakers, self.stop = feed, rollout, learner, breakers, stop
        self.curriculum = curriculum  # told every unit's samples (data.sampler.curriculum)
        self.max_staleness, self.max_response_length = config.async_.max_staleness, config.data.max_response_length
        self.pad_token_id = pad_token_id
        dynamic = config.algorithm.filter_groups  # DAPO's dynamic sampling: more rounds for the same batch
        self.dynamic = (config.data.train_batch_size, dynamic.max_num_gen_batches, update_batch_shape(config),
                        dynamic.kl_groups) if dynamic.enable else None
        self.timeline = Path(config.trainer.default_local_dir) / TIMELINE
        self.trained_samples = 0
        self.last_prompts: list[str] = []  # the ids of the prompts the last step trained on, in unit order

    def __call__(self, roles: Roles, fed: FedBatch, step: int) -> dict[str, float]:
        """Batch ``step - 1`` (0-based) → learn → publish version ``step``."""
        units = fed.units
        timings = {"wait_buffer": fed.wait_s}
        with timed(timings, "step"):
            batch, metrics = self._batch(units, step, timings)
            self.last_prompts = list(dict.fromkeys(batch[keys.UID]))
            self.breakers.check_rollout(metrics, step)  # the generators' texts are in their logs
            learn_start = time.time()
            batch, learned = self.learner(roles, batch, step, timings)
            learn_end = time.time()
            metrics |= learned
            with timed(timings, "publish"):
                self.feed.publish(roles, step)
        timings["step"] += fed.wait_s
        self._record(step, units, (learn_start, learn_end))
        self.trained_samples += len(batch)
        generators = self.feed.generators
        level = self.curriculum.step_done() if self.curriculum is not None else {}
        return level | values(metrics) | self._staleness(units, step) | batch_metrics(batch, timings, self.max_response_length) | \
            self.feed.scheduler.status() | generators.metrics() | {
            "async/version": float(step),
            "async/trainer_wait_fraction": timings["wait_buffer"] / max(timings["step"], 1e-9),
            "async/trained_samples_per_s": self.trained_samples / max(time.perf_counter() - generators.started_at, 1e-9),
            "timing_s/gen": sum(u.seconds for u in units) / len(units),
        }

    def _batch(self, units: list[GeneratedUnit], step: int, timings: dict[str, float]) -> tuple[Batch, Metrics]:
        """The units as one batch (with dynamic sampling, more rounds' units: ``units`` grows), then
        what the rollout decides per batch (group filtering, batch reward norm). A failure before it
        is trained returns the taken units to the buffer, so that a checkpoint written now keeps them."""
        taken = list(self.feed.scheduler.taken)
        try:
            first = self._join(units)
            if self.dynamic is None:
                return self.rollout.finish_batch(*first)

            def more() -> tuple[Batch, Metrics] | None:
                with timed(timings, "wait_buffer"):
                    extra = self.feed.take_round(step - 1, self.stop)
                if extra is None:
                    return None
                taken.extend(self.feed.scheduler.taken)
                units.extend(extra)
                return self._join(extra)

            groups, max_rounds, shape, kl_groups = self.dynamic
            return self.rollout.finish_batch(*dynamic_sample(first, more, groups, max_rounds, shape, self.pad_token_id, kl_groups))
        except BaseException:
            self.feed.scheduler.put_back(taken)
            raise

    def _join(self, units: list[GeneratedUnit]) -> tuple[Batch, Metrics]:
        """The units' rows as one batch: prompts padded to a common width, groups numbered across the batch."""
        batch = join_rollouts([u.batch for u in units], self.pad_token_id)
        batch.tensors[keys.GROUP_IDS] = group_ids_of(batch[keys.UID])
        if self.curriculum is not None:
            self.curriculum.add(batch)
        batch.meta[keys.WEIGHT_VERSION] = min(u.version for u in units)
        return batch, merge(u.metrics for u in units)

    def _staleness(self, units: list[GeneratedUnit], step: int) -> dict[str, float]:
        lags = [step - 1 - u.version for u in units for _ in range(len(u.batch))]  # trained with version step - 1
        if max(lags) > self.max_staleness:  # the scheduler guarantees it; a breach is a bug
            raise RuntimeError(f"step {step}: a sample {max(lags)} versions old, above async.max_staleness; this is a bug")
        metrics = {"async/staleness/mean": sum(lags) / len(lags), "async/staleness/max": float(max(lags))}
        for lag in range(self.max_staleness + 1):
            metrics[f"async/staleness/lag_{lag}"] = lags.count(lag) / len(lags)
        return metrics

    def _record(self, step: int, units: list[GeneratedUnit], learn: tuple[float, float]) -> None:
        """Who worked when (wall-clock seconds): the trainer's learning and each unit's generation."""
        line = {"step": step, "learn": list(learn), "units": [{"generator": u.generator, "interval": list(u.interval)} for u in units]}
        with open(self.timeline, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def async_parts(setup: RolloutSetup, stop: StopSignal) -> RunParts[FedBatch]:
    config = setup.config
    breakers = CircuitBreakers(BreakerLimits.from_config(config))
    learner = Learner(config, breakers, setup.tokenizer)
    feed = GeneratorFeed(config, setup)
    step = AsyncStep(config, feed, setup.rollout, learner, breakers, setup.tokenizer.pad_token_id, stop, curriculum_tracker(setup.data.train))
    validation = None
    if setup.validator is not None:  # the trainer's engine samples only for validation: synced first
        validation = RLValidation(setup.validator, config.trainer.test_freq, config.trainer.val_before_train,
                                  before=lambda roles, step: roles.actor.sync_weights(step))
    mode = f" ({config.async_.num_generators} generator(s), max staleness {config.async_.max_staleness})"
    # the loss corrects for samples of older weights (decoupled PPO), capped; the generators' pools come out of the machine first
    workers = ModeWorkers(config.async_.importance_cap if config.async_.correction == "decoupled" else None, feed.pools)
    return RunParts(
        headline=train_headline(config, setup.total_steps, mode), config=config, total_steps=setup.total_steps, step=step, validation=validation,
        batches=lambda: feed.batches(stop), services=[*rollout_services(setup), feed],
        state={"dataloader": setup.data.train, "kl_controller": learner}, files={ASYNC_STATE: feed},
        trained_prompts=lambda: step.last_prompts, rows_drawn=setup.data.train.rows_drawn, workers=workers,
    )
