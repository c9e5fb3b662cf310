"""``posttrain export``: a run's policy checkpoint as a plain Hugging Face directory (safetensors,
config, tokenizer; LoRA merged) that transformers and vLLM load. Runs in this process, no Ray.
``--weight W`` writes the policy moved back toward the model the run was trained from (or ``--toward
MODEL``): ``MODEL + W * (policy - MODEL)`` weight by weight (WiSE-FT; engines/training/weights.py). ``--average K`` writes the mean, weight by weight, of the run's last K
checkpoints up to the one given (a run directory: its latest), before any ``--weight``."""

from __future__ import annotations

from pathlib import Path

from posttrain.config import load_config
from posttrain.errors import InputError, MissingFileError
from posttrain.models.loading import resolve_model
from posttrain.trainer.checkpoint import CheckpointManager, checkpoint_dir, step_of
from posttrain.trainer.sft import EXPORT_DIR
from posttrain.workers.engines import training_engine


def export_checkpoint(path: str | Path, out_dir: str | Path, toward: str | Path | None = None,
                      weight: float | None = None, average: int = 1) -> Path:
    if toward is not None and weight is None:
        raise InputError("--toward MODEL needs --weight W: how far the policy stays from MODEL (0 is MODEL itself, 1 the policy)")
    if weight is not None and not 0.0 <= weight <= 1.0:
        raise InputError(f"--weight {weight}: give a number from 0 (the model trained from) to 1 (the checkpoint's policy)")
    if average < 1:
        raise InputError(f"--average {average}: give how many of the run's last checkpoints to average (1 is the checkpoint alone)")
    base = _model_dir(toward) if toward is not None else None  # refused before the checkpoint is read
    directory = checkpoint_dir(path)
    averaged = [d / "actor" for d in _last_checkpoints(directory, average)] if average > 1 else []
    config = load_config([directory / "config.yaml"], checks=None)
    arr = config.actor_rollout_ref
    engine = training_engine(
        # nothing is trained here: no clipping (a run saved before grad_clip had to be > 0 may hold 0)
        arr.model.path, arr.model, arr.actor.optim, dtype=arr.actor.dtype, grad_clip=None,
        total_steps=config.trainer.total_training_steps, seed=config.trainer.seed, device="cpu",
    )
    if weight is None:
        engine.load_checkpoint(directory / "actor")
        return engine.export_hf(Path(out_dir), average=averaged)
    base = base or engine.model_dir  # the model the run was trained from (its actor_rollout_ref.model.path)
    if Path(out_dir).resolve() == base.resolve():
        raise InputError(f"--out {out_dir} is the model the policy moves toward: write the export to a directory of its own")
    engine.load_checkpoint(directory / "actor")
    try:
        return engine.export_hf(Path(out_dir), toward=(base, weight), average=averaged)
    except ValueError as err:
        raise InputError(f"posttrain export {path} --weight {weight}: {err}") from err


def _model_dir(toward: str | Path) -> Path:
    """``--toward``: an SFT run's directory (its export), a model directory, a built-in name or a Hub id."""
    if (Path(toward) / EXPORT_DIR).is_dir():
        return Path(toward) / EXPORT_DIR
    try:
        return resolve_model(toward)
    except MissingFileError as err:
        raise InputError(f"--toward {toward}: {err}") from err


def _last_checkpoints(directory: Path, count: int) -> list[Path]:
    """``directory`` (a ``global_step_N`` checkpoint) and the complete ones before it in its run, ``count`` in all."""
    manager = CheckpointManager(directory.parent)
    steps = [step for step in manager.complete_steps() if step <= step_of(directory)]
    if len(steps) < count:
        kept = ", ".join(map(str, steps)) or "none"
        raise InputError(f"--average {count}: {directory.parent} keeps {len(steps)} complete checkpoint(s) up to step "
                         f"{step_of(directory)} (steps {kept}); a run keeps its last trainer.max_ckpt_to_keep, one every trainer.save_freq steps")
    return [manager.step_dir(step) for step in steps[-count:]]
