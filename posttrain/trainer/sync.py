"""The synchronous trainer: PPO / GRPO, generating and training in turns on the same workers.

    for each batch of prompts:
        rollout      repeat each prompt n times (a group), generate with the current weights
        reward       rule scores (and/or a reward model) on each response's last token
        old logprobs the training engine's logprobs of the sampled tokens (PPO's π_old); skipped
                     when the update is a single optimizer step, where π_old is the update's own
                     forward pass, detached (exactly the same numbers)
        reference    π_ref logprobs, when KL is used (in the reward, or as a loss)
        values       the critic's values, when the estimator needs them (GAE)
        advantages   by the configured estimator, on the controller
        update       critic (then actor, after critic_warmup steps)
        sync         new weights into the rollout engine, version + 1
    validation every test_freq steps, a checkpoint every save_freq steps and at the last step (the
    run's trained policy, whatever save_freq says), metrics every step.

A step whose rewards or services failed as a whole, or a run whose updates keep being skipped for
non-finite gradients, stops with a CircuitBreakerError (trainer/breakers.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import torch

from posttrain import keys
from posttrain.algos import get_advantage_estimator, get_kl_estimator, masked_mean
from posttrain.config import to_yaml
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import critic_enabled
from posttrain.controller import WorkerDiedError, WorkerHungError
from posttrain.models import load_tokenizer, resolve_model
from posttrain.protocol import Batch
from posttrain.trainer.breakers import BreakerLimits, CircuitBreakers
from posttrain.trainer.checkpoint import ASYNC_STATE, CheckpointError, CheckpointManager, load_rng_state, save_rng_state, step_of
from posttrain.trainer.data_setup import build_run_data
from posttrain.trainer.metrics import data_metrics, mean_of_ranks, timed, timing_metrics
from posttrain.trainer.phases import apply_kl_in_reward, compute_advantages, kl_controller, repeat_for_groups, single_update_step
from posttrain.trainer.report import FIRST_SAMPLES, load_samples, save_samples, write_report
from posttrain.trainer.roles import Roles, start_roles
from posttrain.trainer.tracking import Tracking, run_tracking
from posttrain.trainer.validation import Validator
from posttrain.trainer.rollout import build_rollout
from posttrain.workers.objectives import PolicyObjective


class SyncTrainer:
    def __init__(self, config: PosttrainConfig) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.default_local_dir)
        self.tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
        # Hub ids are downloaded here, once, with the controller's network; workers then read the cache (offline)
        if critic_enabled(config) and config.critic.model_path:
            resolve_model(config.critic.model_path)
        if config.reward_model.enable and config.reward_model.model_path:
            resolve_model(config.reward_model.model_path)
        self.data = build_run_data(config.data, self.tokenizer)
        epochs_steps = len(self.data.train) * config.trainer.total_epochs
        self.total_steps = min(config.trainer.total_training_steps or epochs_steps, epochs_steps)
        algorithm = config.algorithm
        options = {"gamma": algorithm.gamma, "lam": algorithm.lam} if algorithm.adv_estimator == "gae" else {}
        if algorithm.adv_estimator == "grpo":
            options["scale_by_std"] = algorithm.norm_adv_by_std_in_grpo
        # Every name that selects a function is looked up now, before any worker starts.
        self.estimator = get_advantage_estimator(algorithm.adv_estimator, **options)
        PolicyObjective.from_config(config.actor_rollout_ref.actor, config.data.max_response_length)
        if algorithm.use_kl_in_reward:
            get_kl_estimator(algorithm.kl_penalty)
        self.kl_controller = kl_controller(algorithm.kl_ctrl.type, algorithm.kl_ctrl.kl_coef, algorithm.kl_ctrl.target_kl, algorithm.kl_ctrl.horizon)
        self.rollout = build_rollout(config, self.tokenizer, self.data.data_dir)
        self.rollout.check_data(training=self.data.train.dataset, validation=self.data.val_dataset)
        # One optimizer step per trainer step: π_old is exactly the weights the update starts from, so
        # the loss takes its own forward pass (detached) as π_old and the separate pass is skipped.
        self.on_policy_update = single_update_step(config)
        self.breakers = CircuitBreakers(BreakerLimits.from_config(config))
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep=config.trainer.max_ckpt_to_keep)
        self.step = 0
        self.roles: Roles | None = None
        self.validator = Validator(
            self.rollout, self.data.val, config.actor_rollout_ref.rollout.val_kwargs.n, self.tokenizer,
            config.trainer.val_samples_in_report, self.run_dir / "validation",
        ) if self.data.val else None

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to ``total_steps``; returns the last validation metrics."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.config))
        torch.manual_seed(self.config.trainer.seed)
        self._before_workers()
        self.roles = start_roles(self.config, self.total_steps)  # a failed start stops what it had started
        tracking = None
        try:
            # which process is which rank, and on which Ray node: to find (or stop) one from outside
            actor = self.roles.actor
            (self.run_dir / "processes.json").write_text(json.dumps({"actor": actor.pid(), "actor_nodes": actor.node_id()}))
            self.rollout.open(self.roles)  # the retriever, the Env-LLM client
            resumed = self._resume()
            self._start(resumed)
            # what an earlier attempt logged after the step resumed from is dropped: no step twice
            tracking = run_tracking(self.config, self.run_dir, self.total_steps, purge_step=self.step + 1 if resumed else 0)
            if self.config.trainer.val_before_train and self.step == 0 and self.data.val:
                tracking.log(self.validate(), self.step)
            self._loop(tracking)
        except (WorkerDiedError, WorkerHungError) as err:
            self.checkpoints.name_the_resume(err, self.step)
            raise
        finally:
            if tracking is not None:
                tracking.close()
            self._stop()
            self.roles.release()
            self.rollout.close()
        if self.validator:
            write_report(self.run_dir, self.validator.first_samples, self.validator.last_samples)
        else:
            write_report(self.run_dir)
        return self.val_history[-1] if self.val_history else {}

    def _loop(self, tracking: Tracking) -> None:
        """Generate and train, step after step, with validation and checkpoints when due."""
        for epoch, batch in self._batches():
            self.step += 1
            metrics = self.train_step(batch) | {"training/epoch": float(epoch)}
            self._after_step(metrics, tracking)

    def _after_step(self, metrics: dict[str, float], tracking: Tracking) -> None:
        if self._due(self.config.trainer.test_freq) and self.data.val:
            metrics |= self.validate()
        tracking.log(metrics, self.step)
        if self._due(self.config.trainer.save_freq) or self.step == self.total_steps:  # the last: the run's policy
            self.save_checkpoint()

    # What a mode adds around the loop (asynchronous training: its generators).
    def _before_workers(self) -> None:
        """Checks that need the cluster but no worker yet."""

    def _start(self, resumed: Path | None) -> None:
        """After the workers, the rollout's services and the resume (from ``resumed``, if any)."""

    def _stop(self) -> None:
        """Before the workers are released, whatever ended the run."""

    def _batches(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, prompts) until total_steps; a run resumed at an epoch's end starts the next one."""
        loader = self.data.train
        while loader.epoch < self.config.trainer.total_epochs and self.step < self.total_steps:
            epoch = loader.epoch
            for batch in loader:
                yield epoch, batch
                if self.step >= self.total_steps:
                    return

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.total_steps)

    def train_step(self, prompts: Batch) -> dict[str, float]:
        timings: dict[str, float] = {}
        roles, config = self.roles, self.config
        with timed(timings, "step"):
            # the rollout times its own phases: gen (and reward, for single-turn scoring)
            batch, metrics = self.rollout(roles, repeat_for_groups(prompts, config.actor_rollout_ref.rollout.n), timings=timings)
            self.breakers.check_rollout(metrics, self.step, notes=self.rollout.first_failures)
            if config.algorithm.adv_estimator == "remax":
                with timed(timings, "gen_max"):
                    batch = batch.union(self._greedy_baseline(prompts, batch[keys.GROUP_IDS]))
            batch, learned = self.learn(batch, timings)
            metrics |= learned
            if self.step > config.trainer.critic_warmup:
                with timed(timings, "sync"):
                    roles.actor.sync_weights(self.step)
        return metrics | self.batch_metrics(batch, timings)

    def learn(self, batch: Batch, timings: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """From scored rollouts to updated weights: π_old, π_ref and values as needed, advantages,
        then the critic's and the actor's updates. Returns the batch with what was computed."""
        roles, config = self.roles, self.config
        metrics: dict[str, float] = {}
        if not self.on_policy_update:
            with timed(timings, "old_log_prob"):
                old = roles.actor.compute_log_prob(batch)
                batch = batch.union(old.select([keys.OLD_LOGPROBS]))
                metrics["actor/entropy"] = float(masked_mean(old[keys.ENTROPY], batch[keys.RESPONSE_MASK]))
        if roles.ref is not None:
            with timed(timings, "ref"):
                batch = batch.union(roles.ref.compute_ref_log_prob(batch))
        if roles.critic is not None:
            with timed(timings, "values"):
                batch = batch.union(roles.critic.compute_values(batch))
        with timed(timings, "adv"):
            if config.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_in_reward(batch, self.kl_controller, config.algorithm.kl_penalty)
                metrics |= kl_metrics
            batch = compute_advantages(batch, self.estimator)
        if roles.critic is not None:
            with timed(timings, "update_critic"):
                metrics |= mean_of_ranks(roles.critic.update(batch).metrics)
        if self.step > config.trainer.critic_warmup:
            with timed(timings, "update_actor"):
                metrics |= mean_of_ranks(roles.actor.update(batch).metrics)
        self.breakers.check_update(metrics, self.step)
        return batch, metrics

    def batch_metrics(self, batch: Batch, timings: dict[str, float]) -> dict[str, float]:
        metrics = data_metrics(batch, self.config.data.max_response_length) | timing_metrics(timings, batch)
        metrics["training/weight_version"] = float(batch.meta.get(keys.WEIGHT_VERSION, 0))
        return metrics

    def _greedy_baseline(self, prompts: Batch, group_ids: torch.Tensor) -> Batch:
        """ReMax's baseline: each prompt's greedy response, scored, for every row of its group."""
        scored, _ = self.rollout(self.roles, prompts, validate=True)
        baseline = scored[keys.TOKEN_SCORES].sum(-1)
        return Batch.from_dict({keys.BASELINE_SCORES: baseline[group_ids]})  # group ids number the prompts

    # ---- validation -------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        metrics = self.validator(self.roles, self.step)
        first_samples = self.run_dir / "report" / FIRST_SAMPLES
        if len(self.validator.history) == 1 and (self.resume_from is None or not first_samples.exists()):
            save_samples(first_samples, self.validator.first_samples)  # the run's first validation, for its report
        return metrics

    @property
    def val_history(self) -> list[dict[str, float]]:
        return self.validator.history if self.validator else []

    # ---- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        directory = self.checkpoints.begin(self.step)
        self.roles.actor.save_checkpoint(str(directory / "actor"))
        if self.roles.critic is not None:
            self.roles.critic.save_checkpoint(str(directory / "critic"))
        state = {
            "step": self.step,
            "dataloader": self.data.train.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
        }
        (directory / "trainer_state.json").write_text(json.dumps(state))
        (directory / "config.yaml").write_text(to_yaml(self.config))
        save_rng_state(directory)
        self._save_more(directory)
        return self.checkpoints.commit(self.step)

    def _save_more(self, directory: Path) -> None:
        """What a mode adds to a checkpoint (asynchronous training: its buffer)."""

    @cached_property
    def resume_from(self) -> Path | None:
        """The checkpoint this run continues from (``trainer.resume_mode``), found once."""
        return self.checkpoints.resolve_resume(self.config.trainer.resume_mode)

    def finished(self) -> bool:
        """The checkpoint to continue from already holds the last step: there is nothing to train."""
        return self.resume_from is not None and step_of(self.resume_from) >= self.total_steps

    def _resume(self) -> Path | None:
        """Restore the newest checkpoint (``trainer.resume_mode``); returns its directory, or None.
        Checkpoints after it (an earlier attempt that went further) are moved aside."""
        directory = self.resume_from
        if directory is not None and self.config.trainer.mode == "sync" and (directory / ASYNC_STATE).exists():
            raise CheckpointError(
                f"{directory} was written by an asynchronous run: the prompts it had read ahead are in async_state.pt, "
                "which only trainer.mode=async resumes (or start over: trainer.resume_mode=disable)"
            )
        self.step = self.checkpoints.continue_from(directory)
        if directory is None:
            return None
        state = json.loads((directory / "trainer_state.json").read_text())
        self.data.train.load_state_dict(state["dataloader"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        load_rng_state(directory)
        self.roles.actor.load_checkpoint(str(directory / "actor"), self.step)
        if self.roles.critic is not None:
            self.roles.critic.load_checkpoint(str(directory / "critic"))
        if self.validator:
            self.validator.first_samples = load_samples(self.run_dir / "report" / FIRST_SAMPLES)
        print(f"posttrain: resumed from {directory} (step {self.step})")
        return directory

