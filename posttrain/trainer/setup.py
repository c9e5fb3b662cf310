"""What every mode that rolls out a policy builds before any worker starts: the tokenizer, the
data, the rollout (single-turn or agent) and its validator, and the step count.

Every name, file and dataset row is checked here, on the controller, so a run that cannot work stops
before a worker process exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import critic_enabled
from posttrain.errors import PosttrainError
from posttrain.models import load_tokenizer, resolve_model
from posttrain.rollout import Rollout, build_rollout
from posttrain.rollout.toolbox import tool_schemas
from posttrain.trainer.data_setup import RunData, build_run_data
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


def rollout_setup(config: PosttrainConfig) -> RolloutSetup:
    tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
    # Hub ids are downloaded here, once, with the controller's network; workers then read the cache (offline)
    if critic_enabled(config) and config.critic.model_path:
        resolve_model(config.critic.model_path)
    if config.reward_model.enable and config.reward_model.model_path:
        resolve_model(config.reward_model.model_path)
    data = build_run_data(config.data, tokenizer, tool_schemas(config.env))
    epochs_steps = len(data.train) * config.trainer.total_epochs
    total_steps = min(config.trainer.total_training_steps or epochs_steps, epochs_steps)
    rollout = build_rollout(config, tokenizer, data.data_dir)
    rollout.check_data(training=data.train.dataset, validation=data.val_dataset)
    validator = Validator(
        rollout, data.val, config.actor_rollout_ref.rollout.val_kwargs.n, tokenizer, config.trainer.val_samples_in_report,
        Path(config.trainer.default_local_dir) / "validation",
    ) if data.val else None
    return RolloutSetup(config, tokenizer, data, rollout, validator, total_steps)


class RolloutService:
    """The rollout's resources (the retriever, the Env-LLM client) for as long as the workers are up."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def open(self, roles: Roles, resumed: Path | None) -> None:
        self.rollout.open(roles.for_rollout())

    def close(self) -> None:
        self.rollout.close()


class UnfaithfulPatient(PosttrainError):
    """The doctor's LLM patient contradicts its cases too often for RL against it to mean anything."""

    exit_code = 2


class PatientProbe:
    """Before RL against an LLM patient (the doctor environment, ``patient: llm``): each of up to 64
    yes/no findings of the held-out cases asked as a fresh first question; a patient agreeing on less
    than ``env.llm.min_faithfulness`` stops the run before its first step, with the command that
    trains a faithful one. Not on a resume (the run was probed when it started)."""

    def __init__(self, setup: RolloutSetup) -> None:
        self.setup = setup

    def wanted(self) -> bool:
        env = self.setup.config.env
        return env.name == "doctor" and env.options.get("patient", "llm") == "llm" and env.llm.min_faithfulness is not None

    def open(self, roles: Roles, resumed: Path | None) -> None:
        from posttrain.agents import EpisodeSample
        from posttrain.agents.doctor import patient_faithfulness

        if resumed is not None or not self.wanted():
            return
        llm, data = self.setup.config.env.llm, self.setup.data
        dataset = data.val_dataset or data.train.dataset
        samples = [EpisodeSample(list(s.messages), s.ground_truth, s.data_source, dict(s.extra_info))
                   for s in (dataset[i] for i in range(min(len(dataset), 64)))]
        faithfulness, asked = patient_faithfulness(self.setup.rollout.env_llm, samples)
        self.setup.rollout.env_llm.drain_metrics()  # the probe's requests are not the first step's
        print(f"posttrain: the patient ({llm.url or llm.model_path}) agrees with its cases on {faithfulness:.2f} of {asked} yes/no "
              f"findings it answered (env.llm.min_faithfulness={llm.min_faithfulness:g})")
        if asked and faithfulness < llm.min_faithfulness:
            raise UnfaithfulPatient(
                f"the patient ({llm.url or llm.model_path}) agrees with its cases on {faithfulness:.2f} of {asked} yes/no findings, "
                f"below env.llm.min_faithfulness={llm.min_faithfulness:g}: its answers carry too little for the doctor to learn "
                "from. Train a faithful patient first: `posttrain recipe doctor` does (or, by hand, `posttrain prepare "
                "synthetic-doctor --out data/doctor-patient patient_sft_size=1536` then `posttrain sft "
                "sft.train_files=[data/doctor-patient/patient_sft.parquet] sft.val_rollout=false sft.train_batch_size=16 "
                "sft.total_epochs=1 sft.max_length=512 trainer.experiment_name=doctor_patient_sft` and "
                "env.llm.model_path=runs/posttrain/doctor_patient_sft/export); or set env.llm.min_faithfulness=null to train anyway"
            )

    def close(self) -> None:
        pass
