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

The loop, checkpoints, resume, tracking and stopping are the run skeleton's (trainer/run.py);
this file supplies the step, the validation and the export.

Transcripts are tokenised exactly as the agent loop lays out an episode (``agents/transcript.py``),
with the environment's stop strings (``env.name``), so the model learns the very tokens RL will
feed it. The workers are the RL run's own (``PolicyWorker``), built with the ``sft`` section's
optimizer: see :func:`sft_run_config`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain import keys
from posttrain.config.schema import PosttrainConfig
from posttrain.data import PromptDataLoader
from posttrain.data.sft_dataset import SFTDataError, SFTDataset, SFTSample
from posttrain.errors import ConfigError, Problem
from posttrain.models import load_tokenizer, resolve_model
from posttrain.metrics import merge_collected, values
from posttrain.protocol import Batch
from posttrain.rollout import build_rollout, sequences_to_batch
from posttrain.rollout.toolbox import tool_schemas
from posttrain.trainer.data_setup import build_run_data, resolve_files
from posttrain.trainer.report import Sample
from posttrain.trainer.roles import Roles
from posttrain.trainer.setup import RolloutService
from posttrain.trainer.run import RunParts, epoch_batches, steps_cut_short
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
    return sequences_to_batch(
        [t.prompt_ids for t in transcripts], [t.response_ids for t in transcripts], pad_token_id=pad_token_id,
        loss_masks=[t.loss_mask for t in transcripts],
    )


class SFTStep:
    """One optimizer step on a batch of transcripts; metrics under ``sft/``."""

    def __call__(self, roles: Roles, batch: Batch, step: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics = _renamed(values(merge_collected(roles.actor.sft_step(batch).metrics)))
        return metrics | {"sft/tokens": float(batch[keys.RESPONSE_MASK].sum()), "timing_s/step": time.perf_counter() - start}


class SFTValidation:
    """Before training and at the last step: the validation loss and (with a validator) the RL task's
    validation rollout, the last after the trained weights reach the rollout engine; every
    ``sft.test_freq`` steps between: the loss only."""

    before_training = True

    def __init__(self, val_set: SFTDataset | None, validator: Validator | None, test_freq: int, total_steps: int,
                 micro_batch_size: int, pad_token_id: int) -> None:
        self.val_set, self.validator, self.test_freq, self.total_steps = val_set, validator, test_freq, total_steps
        self.batch_size, self.pad_token_id = micro_batch_size * 4, pad_token_id
        self.loss_history: list[float] = []

    @property
    def history(self) -> list[dict[str, float]]:
        return self.validator.history if self.validator else []

    @property
    def first_samples(self) -> list[Sample]:
        return self.validator.first_samples if self.validator else []

    @first_samples.setter
    def first_samples(self, samples: list[Sample]) -> None:
        if self.validator:
            self.validator.first_samples = samples

    @property
    def last_samples(self) -> list[Sample]:
        return self.validator.last_samples if self.validator else []

    def due(self, step: int, total_steps: int) -> bool:
        return step == total_steps or (self.test_freq > 0 and step % self.test_freq == 0)

    def __call__(self, roles: Roles, step: int) -> dict[str, float]:
        last = step > 0 and step == self.total_steps
        if last:
            roles.actor.sync_weights(step)  # the rollout engine validates the trained weights
        metrics = self.loss(roles)
        if self.validator is not None and (step == 0 or last):
            metrics |= self.validator(roles, step)
        return metrics

    def loss(self, roles: Roles) -> dict[str, float]:
        if self.val_set is None:
            return {}
        loader = PromptDataLoader(self.val_set, self.batch_size, self.pad_token_id, shuffle=False, drop_last=False,
                                  collate=transcripts_to_batch)
        total, tokens = 0.0, 0.0
        for batch in loader:
            logprobs = roles.actor.compute_sft_logprobs(batch)[keys.LOGPROBS]
            mask = batch[keys.RESPONSE_MASK]
            total += float(-(logprobs * mask).sum())
            tokens += float(mask.sum())
        loss = total / max(tokens, 1.0)
        self.loss_history.append(loss)
        return {"val/sft_loss": loss}


def sft_parts(config: PosttrainConfig) -> RunParts[Batch]:
    """The SFT mode's parts; its transcripts are read (and every problem with them found) here."""
    sft = config.sft
    run_dir = Path(config.trainer.default_local_dir)
    tokenizer = load_tokenizer(resolve_model(config.actor_rollout_ref.model.path))
    has_rl_data = bool(config.data.train_files or config.data.builtin)
    data_dir = Path(resolve_files(config.data)[0][0]).parent if has_rl_data else None
    # the environment's stop strings decide whether an agent turn ends on eos (trained) or not
    rollout = build_rollout(config, tokenizer, data_dir) if has_rl_data else None
    tools = tool_schemas(config.env)  # a tool-calling agent's prompts tell it its tools, as in RL
    train_set, val_set = sft_datasets(config, tokenizer, data_dir, rollout.stop_strings if rollout else (), tools)
    pad = tokenizer.pad_token_id
    loader = PromptDataLoader(train_set, sft.train_batch_size, pad, seed=sft.seed, collate=transcripts_to_batch)
    epoch_steps = len(loader) * sft.total_epochs
    total_steps = min(sft.total_training_steps or epoch_steps, epoch_steps)
    if sft.optim.warmup_steps > total_steps:
        raise ConfigError([Problem("sft.optim.warmup_steps", sft.optim.warmup_steps, f"is more than the run's {total_steps} steps; lower it")])
    run_config = sft_run_config(config, total_steps)
    validator = None
    if rollout is not None and sft.val_rollout:
        run_data = build_run_data(run_config.data, tokenizer, tools, tool_format=config.env.tool_format)
        if run_data.val is not None:
            rollout.check_data(validation=run_data.val_dataset)  # a case the environment cannot play fails now
            validator = Validator(rollout, run_data.val, config.actor_rollout_ref.rollout.val_kwargs.n, tokenizer,
                                  config.trainer.val_samples_in_report, run_dir / "validation")
    if validator is None:  # no validation episodes: no environment resources (an Env-LLM worker) to start
        run_config = replace(run_config, env=replace(run_config.env, name=None))
    validation = SFTValidation(val_set, validator, sft.test_freq, total_steps, sft.micro_batch_size_per_gpu, pad)

    def export(roles: Roles) -> Path:
        return Path(roles.actor.export(str(run_dir / EXPORT_DIR))[0])

    capped = steps_cut_short("sft", sft.total_training_steps, sft.total_epochs, total_steps, "transcripts")
    headline = (f"[bold]posttrain sft[/] on {config.actor_rollout_ref.model.path}: {len(train_set)} transcripts"
                f" ({train_set.num_dropped} dropped as too long), {total_steps} steps{capped} → {run_dir}")
    return RunParts(
        headline=headline, config=run_config, total_steps=total_steps, step=SFTStep(), validation=validation,
        batches=lambda: epoch_batches(loader, sft.total_epochs), services=[RolloutService(rollout)] if validator else [],
        state={"dataloader": loader}, rows_drawn=loader.rows_drawn, finish=export,
        more_steps="sft.total_training_steps (or sft.total_epochs)",
    )


def sft_datasets(config: PosttrainConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None,
                 stop_strings: Sequence[str], tools: Sequence[dict] = ()) -> tuple[SFTDataset, SFTDataset | None]:
    """The training and validation transcripts, tokenised as the agent loop lays out an episode."""
    sft = config.sft
    train_files, val_files = sft_files(sft.train_files, sft.val_files, data_dir)
    common = {"max_length": sft.max_length, "messages_key": sft.messages_key, "truncation": sft.truncation,
              "stop_strings": tuple(stop_strings), "require_success": sft.require_success, "tools": tools,
              "tool_format": config.env.tool_format}
    train_set = SFTDataset(train_files, tokenizer, **common)
    if len(train_set) < sft.train_batch_size:
        raise SFTDataError(
            f"sft.train_batch_size={sft.train_batch_size} but {train_files} hold only {len(train_set)} usable "
            "transcripts; lower sft.train_batch_size or add transcripts"
        )
    return train_set, SFTDataset(val_files, tokenizer, **common) if val_files else None


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
