"""The generator: a rollout engine of its own, producing scored groups for asynchronous training.

A generator is a worker with a rollout engine (vLLM; HF generate as a fallback) and the same
rollout that synchronous training runs on the controller, built from the run's config by
:func:`~posttrain.rollout.build_rollout`: :class:`~posttrain.rollout.SingleTurnRollout` (generate,
then the reward manager) or :class:`~posttrain.rollout.AgentRollout` (the agent loop with its own
environments). It plays "the actor" for that rollout (``generate``, ``generate_turn`` from
:class:`~posttrain.workers.sampling.Sampling`). A unit is part of a batch: what is decided across
the batch (group filtering, batch reward normalisation) waits for the trainer's join.

Weights are pulled, never pushed: before each unit of work the generator asks the weight board
(a small Ray actor) for the newest published version, and when it is newer than its own it fetches
that version's one shared object from Ray's object store and loads it into its engine. With the
collective transport (NCCL on GPUs) the trainer broadcasts each version to the generators' group
instead; a generator receives it in a second thread while it generates (``receive_weights``) and
loads it at its next unit boundary, the same place it would have pulled it. With
``partial_rollout="resume"`` it asks again before every agent turn, so an episode that spans an
update continues with the newer weights; every token keeps the version and logprob it was sampled
with either way. A unit is tagged with the version it started with, the oldest of its tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ray.actor import ActorHandle

from posttrain.config.schema import PosttrainConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.controller.memory import RSS_METRIC, resident_gb
from posttrain.models import load_tokenizer, resolve_model
from posttrain.metrics import Metrics, maximum
from posttrain.protocol import Batch
from posttrain.rollout import build_rollout
from posttrain.rollout.batching import repeat_for_groups
from posttrain.rollout.roles import ChatModel, RolloutRoles
from posttrain.workers.engines import rollout_engine
from posttrain.workers.sampling import VALIDATE_META_KEY, Sampling, WeightsAtVersion
from posttrain.workers.weight_broadcast import WeightBroadcast

WEIGHTS_WAIT_S = 600.0  # how long a generator waits for a broadcast version the board already names


@dataclass
class GeneratedUnit:
    """One unit of work done: its scored rows and the version of the weights it started with."""

    index: int
    version: int
    batch: Batch
    metrics: Metrics
    seconds: float
    generator: int = 0
    interval: tuple[float, float] = field(default=(0.0, 0.0))  # wall-clock (time.time()) start and end, for timelines


class GeneratorWorker(Sampling, Worker):
    def __init__(
        self, ctx: WorkerContext, config: PosttrainConfig, data_dir: Path | None, *, board: ActorHandle,
        env_llm: ChatModel | None = None, generator_index: int = 0,
    ) -> None:
        super().__init__(ctx)
        arr = config.actor_rollout_ref
        self.rollout_config, self.data, self.seed, self.group_size = arr.rollout, config.data, config.trainer.seed, arr.rollout.n
        self.board, self.partial_rollout, self.generator_index = board, config.async_.partial_rollout, generator_index
        model_path = str(resolve_model(arr.model.path))
        self.tokenizer = load_tokenizer(model_path)
        max_model_len = config.data.max_prompt_length + config.data.max_response_length
        self.rollout = rollout_engine(model_path, arr.rollout, max_model_len=max_model_len, seed=self.seed)
        self.roles = RolloutRoles(actor=self, env_llm=env_llm)
        self.producer = build_rollout(config, self.tokenizer, data_dir)
        self.producer.open(self.roles)
        self.weight_group: WeightBroadcast | None = None
        self.staged: WeightsAtVersion | None = None  # the newest broadcast weights, not yet loaded
        self._staged_changed = threading.Condition()

    @register(dispatch=Dispatch.RANK_ZERO)
    def produce(self, index: int, prompts: Batch, batch_index: int, row_offset: int) -> GeneratedUnit:
        """Unit ``index``: these prompts (rows ``row_offset``… of batch ``batch_index``), in groups, scored."""
        start, started_at = time.perf_counter(), time.time()
        self.pull_weights()
        version, self.seed_step, self.row_offset = self.rollout.version, batch_index, row_offset
        batch, metrics = self.producer(self.roles, repeat_for_groups(prompts, self.group_size), whole_batch=False)
        metrics[RSS_METRIC.format(group="generator")] = maximum(resident_gb())  # the largest generator's, over a batch's units
        seconds = time.perf_counter() - start
        return GeneratedUnit(index, version, batch, metrics, seconds, self.generator_index, (started_at, time.time()))

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def generate_turn(self, batch: Batch) -> Batch:
        if self.partial_rollout == "resume" and not batch.meta.get(VALIDATE_META_KEY, False):
            self.pull_weights()  # an episode that spans an update continues with the newer weights
        return super().generate_turn(batch)

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def join_weight_group(self, host: str, port: int, rank: int, world_size: int) -> None:
        """Join the trainer's weight-broadcast group as ``rank`` (collective: all members join together)."""
        import torch

        if self.weight_group is not None:
            self.weight_group.close()  # the trainer formed a new group (another generator was replaced)
        self.weight_group = WeightBroadcast(host, port, rank, world_size, "cuda" if torch.cuda.is_available() else "cpu")

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def receive_weights(self) -> int:
        """The trainer's next broadcast, kept for the next unit boundary (runs beside ``produce``)."""
        received = self.weight_group.receive()
        with self._staged_changed:
            if self.staged is None or received.version > self.staged.version:
                self.staged = received
            self._staged_changed.notify_all()
        return received.version

    def pull_weights(self) -> int:
        """Load the newest published weights if they are newer than the engine's; returns the version."""
        import ray

        version, refs = ray.get(self.board.latest.remote())
        if version <= self.rollout.version:
            return self.rollout.version
        published: WeightsAtVersion = ray.get(refs[0]) if refs else self._staged_at_least(version)
        self.rollout.wake_up()
        self.rollout.load_weights(published.named_tensors(), published.version)
        self.rollout.sleep()
        return self.rollout.version

    def _staged_at_least(self, version: int) -> WeightsAtVersion:
        with self._staged_changed:
            arrived = self._staged_changed.wait_for(lambda: self.staged is not None and self.staged.version >= version, WEIGHTS_WAIT_S)
            if not arrived:
                raise TimeoutError(f"version {version} was published but its broadcast did not arrive in {WEIGHTS_WAIT_S:.0f} s")
            staged, self.staged = self.staged, None
            return staged


class WeightBoard:
    """The newest published weights: a version and ``[ref]`` to its one object in the object store.
    Runs as a small Ray actor; the trainer publishes, generators read."""

    def __init__(self) -> None:
        self.version, self.refs = 0, []

    def publish(self, version: int, refs: list) -> None:
        if version > self.version:
            self.version, self.refs = version, refs

    def latest(self) -> tuple[int, list]:
        return self.version, self.refs

