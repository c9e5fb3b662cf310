"""Supervised fine-tuning (``posttrain sft``): the policy imitates transcripts before RL.

    validate     loss on the validation transcripts; the RL task's validation rollout (its reward
                 and accuracy, the same Validator the RL trainer uses) when ``sft.val_rollout``
    for each batch of transcripts:
        step     one optimizer step on the mean negative log-likelihood of the assistant tokens
                 (PolicyWorker.sft_step: the training engine, DDP/FSDP2, LoRA, bf16, micro-batches)
    validation loss every ``sft.test_freq`` steps, a checkpoint every ``trainer.save_freq``
    at the end  new weights into the rollout engine, validation again, and the policy exported as
                a Hugging Face directory, ``<run dir>/export``, which ``posttrain train
                actor_rollout_ref.model.path=<run dir>/export`` starts RL from.

Transcripts are tokenised exactly as the agent loop lays out an episode (``agents/transcript.py``),
with the environment's stop strings (``env.name``), so the model learns the very tokens RL will
feed it. The workers are the RL run's own (``PolicyWorker``), built with the ``sft`` section's
optimizer: see :func:`sft_run_config`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from posttrain import keys
from posttrain.config import ConfigError, to_yaml
from posttrain.config.schema import PosttrainConfig
from posttrain.config.validate import check_sft
from posttrain.controller import WorkerDiedError, WorkerHungError
from posttrain.data import PromptDataLoader
from posttrain.data.sft_dataset import SFTDataError, SFTDataset, SFTSample
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.models import load_tokenizer, resolve_model
from posttrain.protocol import Batch, pad_rows
from posttrain.trainer.checkpoint import CheckpointManager, load_rng_state, save_rng_state
from posttrain.trainer.data_setup import build_run_data, resolve_files
from posttrain.trainer.metrics import mean_of_ranks
from posttrain.trainer.report import write_report
from posttrain.trainer.roles import Roles, start_roles
from posttrain.trainer.rollout import AgentRollout, build_rollout
from posttrain.trainer.tracking import run_tracking
from posttrain.trainer.validation import Validator

SFT_FILE, SFT_VAL_FILE = "sft.parquet", "sft_val.parquet"
EXPORT_DIR = "export"


def sft_run_config(config: PosttrainConfig, total_steps: int) -> PosttrainConfig:
    """The config the SFT run's workers are built from: the policy with ``sft``'s optimizer, LR
    schedule length, clipping and micro-batch size; no critic, reference or reward model."""
    sft, arr = config.sft, config.actor_rollout_ref
    actor = replace(
        arr.actor, optim=sft.optim, grad_clip=sft.grad_clip, ppo_micro_batch_size_per_gpu=sft.micro_batch_size_per_gpu,
        ppo_mini_batch_size=sft.train_batch_size, ppo_epochs=1, use_kl_loss=False,
    )
    return replace(
        config,
        data=replace(config.data, train_batch_size=sft.train_batch_size),
        actor_rollout_ref=replace(arr, actor=actor),
        critic=replace(config.critic, enable=False),
        reward_model=replace(config.reward_model, enable=False),
        algorithm=replace(config.algorithm, use_kl_in_reward=False),
        trainer=replace(config.trainer, total_training_steps=total_steps),
    )


def transcripts_to_batch(samples: Sequence[SFTSample], pad_token_id: int) -> Batch:
    """Transcripts as model inputs: prompts left-padded, responses right-padded, RESPONSE_MASK the loss mask."""
    transcripts = [s.transcript for s in samples]
    prompt_width = max(len(t.prompt_ids) for t in transcripts)
    response_width = max(len(t.response_ids) for t in transcripts)
    prompt_ids = pad_rows([t.prompt_ids for t in transcripts], prompt_width, pad_token_id, left=True)
    prompt_mask = pad_rows([[1] * len(t.prompt_ids) for t in transcripts], prompt_width, left=True)
    response_ids = pad_rows([t.response_ids for t in transcripts], response_width, pad_token_id)
    attention = pad_rows([[1] * len(t.response_ids) for t in transcripts], response_width)
    loss_mask = pad_rows([t.loss_mask for t in transcripts], response_width, dtype=torch.float32)
    inputs = build_model_inputs(prompt_ids, prompt_mask, response_ids, attention)
    return Batch.from_dict(inputs | {keys.PROMPT_IDS: prompt_ids, keys.PROMPT_MASK: prompt_mask, keys.RESPONSE_MASK: loss_mask})


class SFTTrainer:
    def __init__(self, config: PosttrainConfig) -> None:
        sft = config.sft
        problems = check_sft(config)
        if problems:
            raise ConfigError(problems)
        self.run_dir = Path(config.trainer.default_local_dir)
        self.tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
        has_rl_data = bool(config.data.train_files or config.data.builtin)
        data_dir = Path(resolve_files(config.data)[0][0]).parent if has_rl_data else None
        # the environment's stop strings decide whether an agent turn ends on eos (trained) or not
        self.rollout = build_rollout(config, self.tokenizer, data_dir) if has_rl_data else None
        stop_strings = self.rollout.stop_strings if isinstance(self.rollout, AgentRollout) else ()
        train_files, val_files = sft_files(sft.train_files, sft.val_files, data_dir)
        common = {"max_length": sft.max_length, "messages_key": sft.messages_key, "truncation": sft.truncation,
                  "stop_strings": stop_strings, "require_success": sft.require_success}
        self.train_set = SFTDataset(train_files, self.tokenizer, **common)
        self.val_set = SFTDataset(val_files, self.tokenizer, **common) if val_files else None
        if len(self.train_set) < sft.train_batch_size:
            raise SFTDataError(
                f"sft.train_batch_size={sft.train_batch_size} but {train_files} hold only {len(self.train_set)} usable "
                "transcripts; lower sft.train_batch_size or add transcripts"
            )
        pad = self.tokenizer.pad_token_id
        self.train = PromptDataLoader(self.train_set, sft.train_batch_size, pad, seed=sft.seed, collate=transcripts_to_batch)
        epoch_steps = len(self.train) * sft.total_epochs
        self.total_steps = min(sft.total_training_steps or epoch_steps, epoch_steps)
        if sft.optim.warmup_steps > self.total_steps:
            raise ValueError(f"sft.optim.warmup_steps={sft.optim.warmup_steps} is more than the run's {self.total_steps} steps; lower it")
        self.config = sft_run_config(config, self.total_steps)
        self.validator: Validator | None = None
        if self.rollout is not None and sft.val_rollout:
            run_data = build_run_data(self.config.data, self.tokenizer)
            if run_data.val is not None:
                self.rollout.check_data(validation=run_data.val_dataset)  # a case the environment cannot play fails now
                self.validator = Validator(self.rollout, run_data.val, config.actor_rollout_ref.rollout.val_kwargs.n, self.tokenizer,
                                           config.trainer.val_samples_in_report, self.run_dir / "validation")
        if self.validator is None:  # no validation episodes: no environment resources (an Env-LLM worker) to start
            self.config = replace(self.config, env=replace(self.config.env, name=None))
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep=config.trainer.max_ckpt_to_keep)
        self.step = 0
        self.roles: Roles | None = None
        self.loss_history: list[float] = []
        # a checkpoint to resume from is read now, so a run that cannot continue stops before workers start
        self.resume_from = self.checkpoints.resolve_resume(config.trainer.resume_mode)
        if self.resume_from is not None:
            self.train.load_state_dict(json.loads((self.resume_from / "trainer_state.json").read_text())["dataloader"])

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> Path:
        """Train to ``total_steps``; returns the exported Hugging Face directory."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.config))
        torch.manual_seed(self.config.trainer.seed)
        try:
            self.roles = start_roles(self.config, self.total_steps)
            if self.validator is not None:
                self.rollout.open(self.roles)  # e.g. the retriever and the patient the agent's validation episodes call
            return self._fit(self.roles)
        except (WorkerDiedError, WorkerHungError) as err:
            self.checkpoints.name_the_resume(err, self.step)
            raise
        finally:
            if self.roles is not None:
                self.roles.release()
            if self.validator is not None:
                self.rollout.close()

    def _fit(self, roles: Roles) -> Path:
        self._resume()
        # what an earlier attempt logged after the step resumed from is dropped: no step twice
        tracking = run_tracking(self.config, self.run_dir, self.total_steps, purge_step=self.step + 1 if self.resume_from else 0)
        try:
            if self.step == 0:
                tracking.log(self.validate(), 0)
            for epoch, batch in self._batches():
                self.step += 1
                start = time.perf_counter()
                metrics = _renamed(mean_of_ranks(roles.actor.sft_step(batch).metrics))
                metrics |= {"sft/tokens": float(batch[keys.RESPONSE_MASK].sum()), "training/epoch": float(epoch),
                            "timing_s/step": time.perf_counter() - start}
                if self.step == self.total_steps:
                    roles.actor.sync_weights(self.step)  # the rollout engine validates the trained weights
                    metrics |= self.validate()
                elif self._due(self.config.sft.test_freq):
                    metrics |= self.validation_loss()
                tracking.log(metrics, self.step)
                if self._due(self.config.trainer.save_freq):
                    self.save_checkpoint()
        finally:
            tracking.close()
        export = Path(roles.actor.export(str(self.run_dir / EXPORT_DIR))[0])
        samples = (self.validator.first_samples, self.validator.last_samples) if self.validator else ((), ())
        write_report(self.run_dir, *samples)
        return export

    def _batches(self) -> Iterator[tuple[int, Batch]]:
        while self.train.epoch < self.config.sft.total_epochs and self.step < self.total_steps:
            epoch = self.train.epoch
            for batch in self.train:
                yield epoch, batch
                if self.step >= self.total_steps:
                    return

    def _due(self, freq: int) -> bool:
        return freq > 0 and (self.step % freq == 0 or self.step == self.total_steps)

    # ---- validation -------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """The validation loss and, with a validator, the RL task's validation rollout."""
        metrics = self.validation_loss()
        if self.validator is not None:
            metrics |= self.validator(self.roles, self.step)
        return metrics

    def validation_loss(self) -> dict[str, float]:
        if self.val_set is None:
            return {}
        loader = PromptDataLoader(self.val_set, self.config.sft.micro_batch_size_per_gpu * 4, self.tokenizer.pad_token_id,
                                  shuffle=False, drop_last=False, collate=transcripts_to_batch)
        total, tokens = 0.0, 0.0
        for batch in loader:
            logprobs = self.roles.actor.compute_sft_logprobs(batch)[keys.LOGPROBS]
            mask = batch[keys.RESPONSE_MASK]
            total += float(-(logprobs * mask).sum())
            tokens += float(mask.sum())
        loss = total / max(tokens, 1.0)
        self.loss_history.append(loss)
        return {"val/sft_loss": loss}

    # ---- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        directory = self.checkpoints.begin(self.step)
        self.roles.actor.save_checkpoint(str(directory / "actor"))
        (directory / "trainer_state.json").write_text(json.dumps({"step": self.step, "dataloader": self.train.state_dict()}))
        (directory / "config.yaml").write_text(to_yaml(self.config))
        save_rng_state(directory)
        return self.checkpoints.commit(self.step)

    def _resume(self) -> None:
        """Continue from the checkpoint found at start (its data position is already loaded)."""
        directory = self.resume_from
        self.step = self.checkpoints.continue_from(directory)
        if directory is None:
            return
        load_rng_state(directory)
        self.roles.actor.load_checkpoint(str(directory / "actor"), self.step)
        print(f"posttrain: resumed from {directory} (step {self.step})")


def sft_files(train_files: Sequence[str], val_files: Sequence[str], data_dir: Path | None) -> tuple[list[str], list[str]]:
    """The configured files, or ``sft.parquet`` / ``sft_val.parquet`` beside the RL training data."""
    if train_files:
        return list(train_files), list(val_files)
    if data_dir is None or not (data_dir / SFT_FILE).is_file():
        where = f" ({data_dir / SFT_FILE} does not exist)" if data_dir is not None else ""
        raise SFTDataError(
            f"no SFT data{where}: set sft.train_files=[file.parquet,...] (a 'messages' column of chat turns), or use a "
            "built-in dataset that writes expert transcripts, e.g. data.builtin=synthetic-search with "
            "data.builtin_options.sft_size=400"
        )
    return [str(data_dir / SFT_FILE)], list(val_files) or ([str(data_dir / SFT_VAL_FILE)] if (data_dir / SFT_VAL_FILE).is_file() else [])


def _renamed(metrics: dict[str, float]) -> dict[str, float]:
    """The engine reports under ``actor/``; an SFT run's metrics are ``sft/``."""
    return {("sft/" + name.split("/", 1)[1] if name.startswith("actor/") else name): value for name, value in metrics.items()}
