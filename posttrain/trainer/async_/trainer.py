"""The asynchronous trainer: generators produce groups while the trainer updates (``trainer.mode=async``).

    coordinator   start the trainer's roles (policy, reference, critic, Env-LLM) and N generators;
                  publish the starting weights; serve the generators from the unit scheduler
    each step     take batch b from the buffer (its units in data order, each ≤ max_staleness
                  versions old) → learn (π_prox = the trainer's logprobs before the update; π_ref,
                  values, advantages; critic and actor updates with the decoupled-PPO correction
                  against the behaviour logprobs) → publish version b + 1: one object in Ray's
                  object store, or a broadcast to the generators' group (``async.weight_transport``;
                  NCCL on GPUs) → the generators load it before their next unit
    validation    on the trainer's own rollout engine, synced just before
    checkpoints   the sync trainer's, plus the scheduler's snapshot: the data position and every
                  unit not yet trained (finished ones as generated, the rest as prompts)
    stopping      at the end, on Ctrl-C / SIGTERM, or when ``<run dir>/STOP`` appears: the
                  in-flight units are abandoned (their prompts are in the checkpoint) and a final
                  checkpoint is written (the last step always writes one, as in sync mode); a dead
                  or stuck trainer worker stops the run pointing at the last one, as in sync mode

It reuses the synchronous trainer's phases (``learn``), validation, checkpoints and tracking; only
where the batch comes from and how the weights travel differ.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import torch

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.controller import ResourceError
from posttrain.errors import PosttrainError
from posttrain.protocol import Batch, pad_rows
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.trainer.async_.buffer import SchedulerClosed, UnitScheduler
from posttrain.trainer.async_.coordinator import Generators, RolloutRecipe, generator_config
from posttrain.trainer.checkpoint import ASYNC_STATE
from posttrain.trainer.metrics import timed
from posttrain.trainer.phases import group_ids_of, single_update_step
from posttrain.trainer.roles import WORKER_ENV, _use_gpu, generator_cpus, trainer_cpus_per_worker
from posttrain.trainer.sync import SyncTrainer
from posttrain.trainer.tracking import Tracking
from posttrain.workers.generator import GeneratedUnit, WeightBoard

STOP_FILE = "STOP"


class StopRequested(Exception):
    """Ctrl-C, SIGTERM or the STOP file: finish gracefully with a checkpoint."""


class GeneratorsFailed(PosttrainError):
    """The generators stopped the run (a bug, an environment error, a generator that kept dying);
    the trainer's state is checkpointed first."""


class AsyncTrainer(SyncTrainer):
    def __init__(self, config: PosttrainConfig) -> None:
        super().__init__(config)
        options = config.async_
        # The proximal policy π_prox is the trainer's weights before the update (not the sampling
        # ones): for a single optimizer step that is the update's own forward pass, detached, as in
        # sync mode; with several mini-batches or epochs it is a pass of its own.
        self.on_policy_update = single_update_step(config)
        batch = config.data.train_batch_size
        self.groups_per_unit = options.unit_groups or max(1, batch // options.num_generators)
        if batch % self.groups_per_unit:
            self.groups_per_unit = batch  # a batch that does not split evenly goes to one generator at a time
        self.units_per_batch = batch // self.groups_per_unit
        capacity_groups = options.buffer_size or (options.max_staleness + 1) * batch
        self.capacity_units = max(self.units_per_batch, capacity_groups // self.groups_per_unit)
        self.scheduler: UnitScheduler | None = None
        self.generators: Generators | None = None
        self.board = None
        self.trained_samples = 0
        self._stop_event = threading.Event()  # set by Ctrl-C / SIGTERM; honoured between steps
        self._restore_signals = lambda: None

    # ---- the loop ---------------------------------------------------------------------------

    def _before_workers(self) -> None:
        (self.run_dir / STOP_FILE).unlink(missing_ok=True)
        self._check_cluster()

    def _start(self, resumed: Path | None) -> None:
        """The scheduler (with a resumed run's buffer), the weight board, the generators."""
        import ray

        self.scheduler = self._new_scheduler()
        if resumed is not None and (resumed / ASYNC_STATE).exists():
            state = torch.load(resumed / ASYNC_STATE, weights_only=False)
            self.data.train.load_state_dict(state["data"])  # where the generators had read to
            self.scheduler.restore(state)
        self.board = ray.remote(WeightBoard).options(num_cpus=0).remote()
        self.generators = self._generators()
        self.generators.start()
        self._publish()  # a resumed run's weights reach the generators before any unit starts
        self.generators.serve()
        self._restore_signals = _stop_on_signals(self._stop_event)

    def _loop(self, tracking: Tracking) -> None:
        try:
            while self.step < self.total_steps:
                self._check_stop()
                metrics = self.train_step()
                self._after_step(metrics, tracking)
        except StopRequested as stop:
            path = self._checkpoint_now()
            print(f"posttrain: stopped at step {self.step} ({stop}); resumable checkpoint {path}")
            raise StopRequested(str(path)) from None
        except SchedulerClosed as err:
            path = self._checkpoint_now()
            raise GeneratorsFailed(f"the generators stopped the run: {err}. The trainer's state is in {path}; fix the "
                                   "cause and run the same command to resume") from err

    def _check_stop(self) -> None:
        """Between steps, and while waiting for a batch: a stop asked for ends the loop here."""
        if self._stop_event.is_set():
            raise StopRequested("interrupted")
        if (self.run_dir / STOP_FILE).exists():
            raise StopRequested(f"{self.run_dir / STOP_FILE} exists")

    def _while_waiting(self) -> None:
        self._check_stop()
        self.generators.maintain(self.step)  # a replaced generator gets the current weights

    def _checkpoint_now(self) -> Path:
        """The generators stopped (nothing new starts), then the trainer's state with the buffer. A
        trainer found dead here (the generators saw it first: its weights were gone) stops the run as
        a dead worker does anywhere, naming the last checkpoint (``SyncTrainer.fit``)."""
        self.generators.stop()
        return self.save_checkpoint()

    def train_step(self) -> dict[str, float]:
        """Batch ``self.step`` (0-based) from the buffer → learn → publish version ``self.step``.
        Signals only set an event, so a step is never cut in half: it is taken, learned and published."""
        timings: dict[str, float] = {}
        with timed(timings, "step"):
            with timed(timings, "wait_buffer"):
                units = self.scheduler.take_batch(self.step, while_waiting=self._while_waiting)
            self.step += 1
            batch, metrics = self._join(units)
            self.breakers.check_rollout(metrics, self.step, units=len(units))  # the generators' texts are in their logs
            self._count_staleness(units, metrics)
            batch, learned = self.learn(batch, timings)
            metrics |= learned
            with timed(timings, "publish"):
                self._publish()
        self.trained_samples += len(batch)
        metrics |= self.batch_metrics(batch, timings) | self.scheduler.status() | self.generators.metrics()
        metrics |= {
            "async/version": float(self.step),
            "async/trainer_wait_fraction": timings["wait_buffer"] / max(timings["step"], 1e-9),
            "async/trained_samples_per_s": self.trained_samples / max(time.perf_counter() - self.generators.started_at, 1e-9),
            "timing_s/gen": sum(u.seconds for u in units) / len(units),
        }
        return metrics

    def _join(self, units: list[GeneratedUnit]) -> tuple[Batch, dict[str, float]]:
        """The units' rows as one batch: prompts re-padded to a common width, groups numbered across
        the batch, then what the rollout decides per batch (group filtering, batch reward norm)."""
        batch = join_rollouts([u.batch for u in units], self.tokenizer.pad_token_id)
        batch.tensors[keys.GROUP_IDS] = group_ids_of(batch[keys.UID])
        batch.meta[keys.WEIGHT_VERSION] = min(u.version for u in units)
        batch, metrics = self.rollout.finish_batch(batch, merge_unit_metrics([u.metrics for u in units]))
        return batch, metrics

    def _count_staleness(self, units: list[GeneratedUnit], metrics: dict[str, float]) -> None:
        lags = [self.step - 1 - u.version for u in units for _ in range(len(u.batch))]  # trained with version step - 1
        if max(lags) > self.config.async_.max_staleness:  # the scheduler guarantees it; a breach is a bug
            raise RuntimeError(f"step {self.step}: a sample {max(lags)} versions old, above async.max_staleness; this is a bug")
        metrics["async/staleness/mean"] = sum(lags) / len(lags)
        metrics["async/staleness/max"] = float(max(lags))
        for lag in range(self.config.async_.max_staleness + 1):
            metrics[f"async/staleness/lag_{lag}"] = lags.count(lag) / len(lags)

    # ---- weights, generators, the scheduler ---------------------------------------------------

    def _publish(self) -> None:
        """The trainer's weights as version ``self.step`` (updates done), for the generators to load."""
        import ray

        version = self.step
        if version > 0:
            if self.generators.collective:
                self.generators.broadcast(version)
                refs = []
            else:
                refs = self.roles.actor.publish_weights(version)[0]
            try:
                ray.get(self.board.publish.remote(version, refs), timeout=self.config.trainer.call_timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                path = self._checkpoint_now()  # the weights are the trainer's: they are safe to save
                raise GeneratorsFailed(f"the weight board (the actor that tells generators the newest version) did not take "
                                       f"version {version} ({type(err).__name__}); the trainer's state is in {path}: run the "
                                       "same command to resume") from err
        if self.scheduler is not None:
            self.scheduler.advance(version)

    def _new_scheduler(self) -> UnitScheduler:
        batches = self._batches()  # the sync trainer's supply, read ahead by the generators

        def next_prompts() -> Batch | None:
            return next((batch for _, batch in batches), None)

        return UnitScheduler(
            units_per_batch=self.units_per_batch, groups_per_unit=self.groups_per_unit,
            group_size=self.config.actor_rollout_ref.rollout.n, capacity_units=self.capacity_units,
            max_staleness=self.config.async_.max_staleness, total_batches=self.total_steps, next_prompts=next_prompts,
            version=self.step,
        )

    def _generators(self) -> Generators:
        retriever = self.rollout.retriever.client.url if getattr(self.rollout, "retriever", None) else None
        recipe = RolloutRecipe(generator_config(self.config, retriever), self.data.data_dir)
        return Generators(
            self.config, self.scheduler, recipe, self.board, self.roles.actor, self.roles.env_llm, self.run_dir, WORKER_ENV,
            gpus=1.0 if _use_gpu(self.config.trainer.device) else 0.0,
        )

    def _check_cluster(self) -> None:
        """More generators than the machine (or cluster) can host: refused before anything starts."""
        import ray

        trainer, options = self.config.trainer, self.config.async_
        ranks = trainer.n_workers_per_node * trainer.nnodes
        trainer_cpus = trainer_cpus_per_worker(self.config) * ranks
        need = generator_cpus(self.config) + trainer_cpus
        have = ray.cluster_resources()
        if need > have.get("CPU", 0):
            raise ResourceError(
                f"async.num_generators={options.num_generators} × async.generator_cpus={options.generator_cpus} plus the "
                f"trainer's {trainer_cpus} CPU(s) need {need:g} CPUs; the cluster has {have.get('CPU', 0):g}. Use fewer "
                "generators, or join a bigger cluster (trainer.ray_address)"
            )
        if _use_gpu(trainer.device):
            need_gpus = ranks + options.num_generators * options.generator_gpus
            if need_gpus > have.get("GPU", 0):
                raise ResourceError(
                    f"the trainer's {ranks} GPU(s) plus async.num_generators={options.num_generators} × async.generator_gpus="
                    f"{options.generator_gpus} need {need_gpus:g} GPUs; the cluster has {have.get('GPU', 0):g}. Generators "
                    "need GPUs besides the trainer's (a fraction, e.g. async.generator_gpus=0.5, lets two share one; "
                    "weights then go through the object store): use fewer generators or a machine with more GPUs"
                )

    # ---- validation and checkpoints -----------------------------------------------------------

    def _stop(self) -> None:
        self._restore_signals()
        if self.generators is not None:
            self.generators.stop()
        if self.board is not None:
            import ray

            ray.kill(self.board)

    def validate(self) -> dict[str, float]:
        self.roles.actor.sync_weights(self.step)  # the trainer's engine samples only for validation
        return super().validate()

    def _save_more(self, directory: Path) -> None:
        torch.save(self.scheduler.snapshot(self.data.train.state_dict), directory / ASYNC_STATE)


def join_rollouts(batches: list[Batch], pad_token_id: int) -> Batch:
    """Concatenate rollouts whose prompts were padded to different widths (units of agent episodes)."""
    width = max(b[keys.PROMPT_IDS].shape[1] for b in batches)
    padded = []
    for batch in batches:
        prompt_width = batch[keys.PROMPT_IDS].shape[1]
        tensors = dict(batch.tensors)
        if prompt_width < width:
            prompt_ids = pad_rows([row[mask.bool()].tolist() for row, mask in zip(batch[keys.PROMPT_IDS], batch[keys.PROMPT_MASK])],
                                  width, pad_token_id, left=True)
            prompt_mask = pad_rows([[1] * int(mask.sum()) for mask in batch[keys.PROMPT_MASK]], width, left=True)
            response_attention = batch[keys.ATTENTION_MASK][:, prompt_width:]
            tensors |= build_model_inputs(prompt_ids, prompt_mask, batch[keys.RESPONSE_IDS], response_attention)
            tensors |= {keys.PROMPT_IDS: prompt_ids, keys.PROMPT_MASK: prompt_mask}
        padded.append(Batch(tensors, batch.non_tensors, {}))
    return Batch.concat(padded)


def merge_unit_metrics(per_unit: list[dict[str, float]]) -> dict[str, float]:
    """One value per metric over a batch's units: the max of ``*/max``, the min of ``*/min``, else the mean."""
    merged = {}
    for name in {name for metrics in per_unit for name in metrics}:
        values = [metrics[name] for metrics in per_unit if name in metrics]
        merged[name] = max(values) if name.endswith("/max") else min(values) if name.endswith("/min") else sum(values) / len(values)
    return merged


def _stop_on_signals(event: threading.Event):
    """Ctrl-C and SIGTERM ask for a graceful stop (``event``; a checkpoint at the next step boundary);
    a second one stops at once. Returns what restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def ask_to_stop(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        event.set()
        print("posttrain: stopping after this step with a checkpoint (again to stop at once)", flush=True)

    for sig in previous:
        signal.signal(sig, ask_to_stop)
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]
