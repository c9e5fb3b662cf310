"""What every mode that rolls out a policy builds before any worker starts: the tokenizer, the
data, the rollout (single-turn or agent) and its validator, and the step count; and the services a
training mode opens for that rollout (its resources; the environment's check before step 1).

Every name, file and dataset row is checked here, on the controller, so a run that cannot work stops
before a worker process exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain.agents.env import EpisodeSample
from posttrain.config.mixture import mixture_sources
from posttrain.config.schema import PosttrainConfig
from posttrain.config.algorithm_checks import critic_enabled
from posttrain.models import load_tokenizer, resolve_model
from posttrain.rollout import Rollout, build_rollout
from posttrain.rollout.mixture import rollout_parts
from posttrain.rollout.scoring import check_judge
from posttrain.rollout.toolbox import tool_schemas
from posttrain.trainer.data_setup import RunData, build_mixture_data, build_run_data
from posttrain.trainer.roles import Roles
from posttrain.trainer.validation import Validator


@dataclass
class RolloutSetup:
    config: PosttrainConfig
    tokenizer: PreTrainedTokenizerBase
    data: RunData
    rollout: Rollout
    validator: Validator | None
    total_steps: int


def rollout_setup(config: PosttrainConfig, training: bool = True) -> RolloutSetup:
    """The run's tokenizer, data, rollout and validator; ``training`` False (``posttrain eval``): no
    training set is read (``total_steps`` 0)."""
    tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
    # Hub ids are downloaded here, once, with the controller's network; workers then read the cache (offline)
    if critic_enabled(config) and config.critic.model_path:
        resolve_model(config.critic.model_path)
    if config.reward_model.enable and config.reward_model.model_path:
        resolve_model(config.reward_model.model_path)
    sources = mixture_sources(config)
    data = build_mixture_data(config.data, sources, tokenizer, training) if sources else \
        build_run_data(config.data, tokenizer, tool_schemas(config.env), training, config.env.tool_format)
    epochs_steps = len(data.train) * config.trainer.total_epochs if data.train is not None else 0
    total_steps = min(config.trainer.total_training_steps or epochs_steps, epochs_steps)
    rollout = build_rollout(config, tokenizer, data.data_dir)
    rollout.check_data(training=data.train.dataset if data.train is not None else None, validation=data.val_dataset)
    validator = Validator(
        rollout, data.val, config.actor_rollout_ref.rollout.val_kwargs.n, tokenizer, config.trainer.val_samples_in_report,
        Path(config.trainer.default_local_dir) / "validation",
    ) if data.val else None
    return RolloutSetup(config, tokenizer, data, rollout, validator, total_steps)


def rollout_services(setup: RolloutSetup) -> list[RolloutService | BeforeTraining]:
    """What a training mode opens for its rollout, in order: the rollout's resources, then the
    environment's check before step 1."""
    return [RolloutService(setup.rollout), BeforeTraining(setup)]


class RolloutService:
    """The rollout's resources (the retriever, the Env-LLM client) for as long as the workers are up."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def open(self, roles: Roles, resumed: Path | None) -> None:
        self.rollout.open(roles.for_rollout())

    def close(self) -> None:
        self.rollout.close()


class BeforeTraining:
    """The environment's own check before step 1 of a run that starts (its class's ``before_training``,
    asked through the rollout: e.g. the doctor's patient probe), against the opened resources and the
    held-out rows (the training rows without them). Not on a resume (the run was checked when it started)."""

    def __init__(self, setup: RolloutSetup) -> None:
        self.setup = setup

    def open(self, roles: Roles, resumed: Path | None) -> None:
        if resumed is None:
            rollout = self.setup.rollout
            rollout.before_training(self.samples())
            # a rubric's judge against its rules; a mixture's: each source's, on its own rows
            for name, config, part in rollout_parts(rollout, self.setup.config):
                judged = islice((row for row in self.samples() if name is None or row.source == name), config.reward.judge.agreement_rows)
                check_judge(config, part.reward_manager, list(judged))

    def samples(self) -> Iterator[EpisodeSample]:
        """The rows as an environment sees them, read as far as it asks."""
        data = self.setup.data
        dataset = data.val_dataset or data.train.dataset
        for index in range(len(dataset)):
            row = dataset[index]
            yield EpisodeSample(list(row.messages), row.ground_truth, row.data_source, dict(row.extra_info), row.source)

    def close(self) -> None:
        pass
