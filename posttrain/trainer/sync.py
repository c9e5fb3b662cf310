"""The synchronous mode: PPO / GRPO, generating and training in turns on the same workers.

    for each batch of prompts (trainer/run.py runs the loop, validation and checkpoints):
        rollout      repeat each prompt n times (a group), generate with the current weights, score;
                     with ``algorithm.filter_groups`` (DAPO's dynamic sampling) drop the groups whose
                     rewards are all equal and generate the next prompts until the batch is full
        phases       what an estimator adds to the scored batch (ReMax: the greedy baseline)
        learn        π_old, π_ref, values, advantages, critic and actor updates (trainer/learn.py)
        sync         new weights into the rollout engine, version + 1

A step whose rewards or services failed as a whole, or a run whose updates keep being skipped for
non-finite gradients, stops with a CircuitBreakerError (trainer/breakers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.config.algorithm_checks import needs_greedy_baseline
from posttrain.metrics import Metrics, values
from posttrain.protocol import Batch
from posttrain.rollout import Rollout, repeat_for_groups
from posttrain.rollout.groups import dynamic_sample, update_batch_shape
from posttrain.timing import timed
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakers
from posttrain.trainer.data_setup import CurriculumTracker, curriculum_tracker
from posttrain.trainer.learn import Learner
from posttrain.trainer.metrics import data_metrics, timing_metrics
from posttrain.trainer.roles import Roles
from posttrain.trainer.setup import RolloutSetup, rollout_services
from posttrain.trainer.run import RunParts, epoch_batches, steps_cut_short
from posttrain.trainer.validation import RLValidation

# a phase between the rollout and learning: (roles, the step's prompts, the scored batch, timings) → batch
Phase = Callable[[Roles, Batch, Batch, dict[str, float]], Batch]


class GreedyBaseline:
    """ReMax's baseline: each prompt's greedy response, scored, for every row of its group."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def __call__(self, roles: Roles, prompts: Batch, batch: Batch, timings: dict[str, float]) -> Batch:
        with timed(timings, "gen_max"):
            scored, _ = self.rollout(roles.for_rollout(), prompts, validate=True)
        baseline = scored[keys.TOKEN_SCORES].sum(-1)
        group_ids = batch[keys.GROUP_IDS]  # group ids number the prompts
        return batch.union(Batch.from_dict({keys.BASELINE_SCORES: baseline[group_ids]}))


def estimator_phases(config: PosttrainConfig, rollout: Rollout) -> list[Phase]:
    """What the advantage estimator declares it needs before learning (ReMax: a greedy baseline)."""
    return [GreedyBaseline(rollout)] if needs_greedy_baseline(config) else []


class SyncStep:
    """rollout (more rounds with dynamic sampling) → phases → learn → sync, timed (``timing_s/*``)."""

    def __init__(self, config: PosttrainConfig, rollout: Rollout, learner: Learner, breakers: CircuitBreakers,
                 phases: Sequence[Phase] = (), more_prompts: Callable[[], Batch | None] | None = None, pad_token_id: int = 0,
                 curriculum: CurriculumTracker | None = None) -> None:
        self.rollout, self.learner, self.breakers, self.phases = rollout, learner, breakers, list(phases)
        self.curriculum = curriculum  # told every round's samples (data.sampler.curriculum)
        self.group_size = config.actor_rollout_ref.rollout.n
        self.critic_warmup, self.max_response_length = config.trainer.critic_warmup, config.data.max_response_length
        self.last_prompts: list[str] = []  # the ids of the prompts the last step trained on
        dynamic = config.algorithm.filter_groups
        # DAPO's dynamic sampling: the next prompts of the run's data, for rounds after the first
        self.more_prompts = more_prompts if dynamic.enable else None
        self.max_rounds, self.groups, self.pad_token_id = dynamic.max_num_gen_batches, config.data.train_batch_size, pad_token_id
        self.kl_groups = dynamic.kl_groups
        self.shape = update_batch_shape(config)

    def __call__(self, roles: Roles, prompts: Batch, step: int) -> dict[str, float]:
        timings: dict[str, float] = {}
        with timed(timings, "step"):
            # the rollout times its own phases: gen (and reward, for single-turn scoring)
            batch, metrics = self._round(roles, prompts, timings)
            if self.more_prompts is not None:
                def more() -> tuple[Batch, Metrics] | None:
                    extra = self.more_prompts()
                    return None if extra is None else self._round(roles, extra, timings)

                batch, metrics = dynamic_sample((batch, metrics), more, self.groups, self.max_rounds, self.shape, self.pad_token_id,
                                                    self.kl_groups)
            batch, metrics = self.rollout.finish_batch(batch, metrics)
            self.last_prompts = list(dict.fromkeys(batch[keys.UID]))
            self.breakers.check_rollout(metrics, step, notes=self.rollout.first_failures)
            for phase in self.phases:
                batch = phase(roles, prompts, batch, timings)
            batch, learned = self.learner(roles, batch, step, timings)
            metrics |= learned
            if step > self.critic_warmup:
                with timed(timings, "sync"):
                    roles.actor.sync_weights(step)
        level = self.curriculum.step_done() if self.curriculum is not None else {}
        return values(metrics) | batch_metrics(batch, timings, self.max_response_length) | level

    def _round(self, roles: Roles, prompts: Batch, timings: dict[str, float]) -> tuple[Batch, Metrics]:
        generated = self.rollout(roles.for_rollout(), repeat_for_groups(prompts, self.group_size), timings=timings, whole_batch=False)
        if self.curriculum is not None:
            self.curriculum.add(generated[0])
        return generated


def batch_metrics(batch: Batch, timings: dict[str, float], max_response_length: int) -> dict[str, float]:
    metrics = data_metrics(batch, max_response_length) | timing_metrics(timings, batch)
    metrics["training/weight_version"] = float(batch.meta.get(keys.WEIGHT_VERSION, 0))
    return metrics


def train_headline(config: PosttrainConfig, total_steps: int, mode: str = "") -> str:
    """The run's first line, and says when the data's epochs cut trainer.total_training_steps short."""
    capped = steps_cut_short("trainer", config.trainer.total_training_steps, config.trainer.total_epochs, total_steps)
    return (f"[bold]posttrain[/] {config.algorithm.adv_estimator} on {config.actor_rollout_ref.model.path}: "
            f"{total_steps} steps{mode}{capped} → {config.trainer.default_local_dir}")


def sync_parts(setup: RolloutSetup) -> RunParts[Batch]:
    config = setup.config
    breakers = CircuitBreakers(BreakerLimits.from_config(config))
    learner = Learner(config, breakers, setup.tokenizer)
    loader = setup.data.train
    stream = epoch_batches(loader, config.trainer.total_epochs)  # one stream: the steps, and dynamic sampling's extra rounds
    step = SyncStep(config, setup.rollout, learner, breakers, estimator_phases(config, setup.rollout),
                    more_prompts=lambda: next(stream, (None, None))[1], pad_token_id=setup.tokenizer.pad_token_id,
                    curriculum=curriculum_tracker(loader))
    validation = RLValidation(setup.validator, config.trainer.test_freq, config.trainer.val_before_train) if setup.validator else None
    return RunParts(
        headline=train_headline(config, setup.total_steps), config=config, total_steps=setup.total_steps, step=step, validation=validation,
        batches=lambda: stream, services=rollout_services(setup), state={"dataloader": loader, "kl_controller": learner},
        trained_prompts=lambda: step.last_prompts, rows_drawn=loader.rows_drawn,
    )
