"""``posttrain export``: a run's policy checkpoint as a plain Hugging Face directory (safetensors,
config, tokenizer; LoRA merged) that transformers and vLLM load. Runs in this process, no Ray.
``--weight W`` writes the policy moved back toward the model the run was trained from (or ``--toward
MODEL``): ``MODEL + W * (policy - MODEL)`` weight by weight (WiSE-FT; engines/training/weights.py); W above 1
carries the policy on past itself along that line (ExPO).
``--average K`` writes the mean, weight by weight, of the run's last K checkpoints up to the one given
(a run directory: its latest), before any ``--weight``. ``--with RUN`` (repeatable) puts other runs of the
same model in that mean: their checkpoints (the same last K of each) beside the one given, e.g. the final
policies of one configuration trained with other seeds (a model soup)."""

from __future__ import annotations

import sys
from pathlib import Path

from posttrain.config import load_config
from posttrain.engines.training.weights import check_weight
from posttrain.errors import InputError, MissingFileError
from posttrain.models.loading import resolve_model
from posttrain.trainer.checkpoint import STEP_DIR, CheckpointError, CheckpointManager, checkpoint_dir, step_of
from posttrain.trainer.sft import EXPORT_DIR
from posttrain.workers.engines import training_engine


def export_checkpoint(path: str | Path, out_dir: str | Path, toward: str | Path | None = None,
                      weight: float | None = None, average: int = 1, with_runs: tuple = ()) -> Path:
    if toward is not None and weight is None:
        raise InputError("--toward MODEL needs --weight W: how far the policy stays from MODEL (0 is MODEL itself, 1 the policy)")
    if weight is not None:
        try:
            check_weight(weight, "--weight")
        except ValueError as err:
            raise InputError(str(err)) from err
    if average < 1:
        raise InputError(f"--average {average}: give how many of the run's last checkpoints to average (1 is the checkpoint alone)")
    base = _model_dir(toward) if toward is not None else None  # refused before the checkpoint is read
    directory = checkpoint_dir(path)
    runs = [directory, *(_other_run(run) for run in with_runs)]
    taken = _checkpoints_averaged(runs, average) if len(runs) > 1 or average > 1 else []
    config = load_config([directory / "config.yaml"], checks=None)
    arr = config.actor_rollout_ref
    _check_same_model(arr.model, dict(zip(with_runs, runs[1:])))
    _say_averaged(runs, taken)
    to_average = [d / "actor" for checkpoints in taken for d in checkpoints]
    engine = training_engine(
        # nothing is trained here: no clipping (a run saved before grad_clip had to be > 0 may hold 0)
        arr.model.path, arr.model, arr.actor.optim, dtype=arr.actor.dtype, grad_clip=None,
        total_steps=config.trainer.total_training_steps, seed=config.trainer.seed, device="cpu",
    )
    if weight is not None:
        base = base or engine.model_dir  # the model the run was trained from (its actor_rollout_ref.model.path)
        if Path(out_dir).resolve() == base.resolve():
            raise InputError(f"--out {out_dir} is the model the policy moves toward: write the export to a directory of its own")
    if not to_average:  # an average loads each checkpoint's weights itself
        engine.load_checkpoint(directory / "actor")
    if weight is None:
        return engine.export_hf(Path(out_dir), average=to_average)
    if weight > 1.0:
        print(f"posttrain export: --weight {weight} carries the policy on past itself, away from the model it moved from "
              "(an extrapolation: choose W on development rows)", file=sys.stderr)
    try:
        return engine.export_hf(Path(out_dir), toward=(base, weight), average=to_average)
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


def _other_run(run: str | Path) -> Path:
    try:
        return checkpoint_dir(run)
    except (MissingFileError, CheckpointError) as err:
        raise InputError(f"--with {run}: {err}") from err


def _check_same_model(model, others: dict) -> None:
    """``--with``: each other run's checkpoint (``others``: by the name given) was trained from the same model as
    ``model`` (the checkpoint given's ``actor_rollout_ref.model``), with the same LoRA, if any: a mean of policies
    that started from different models is no policy. Refused naming both, before any weight is read."""
    for given, checkpoint in others.items():
        theirs = load_config([checkpoint / "config.yaml"], checks=None).actor_rollout_ref.model
        if _same_path(theirs.path) != _same_path(model.path):
            raise InputError(f"--with {given}: that run was trained from {theirs.path}, the checkpoint given from {model.path}: "
                             "average runs that started from the same model (seeds of one configuration)")
        if (theirs.lora_rank, theirs.target_modules) != (model.lora_rank, model.target_modules):
            raise InputError(f"--with {given}: that run trained LoRA rank {theirs.lora_rank} on {theirs.target_modules}, the "
                             f"checkpoint given rank {model.lora_rank} on {model.target_modules} (rank 0: every weight): "
                             "average runs that trained the same weights")


def _same_path(model: str) -> str:
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else str(model)


def _checkpoints_averaged(runs: list[Path], count: int) -> list[list[Path]]:
    """The last ``count`` checkpoints of each of ``runs``; refused if one is in the mean twice."""
    taken = [_last_checkpoints(run, count) for run in runs]
    seen: set[Path] = set()
    for checkpoint in (d.resolve() for checkpoints in taken for d in checkpoints):
        if checkpoint in seen:
            raise InputError(f"--with: the checkpoint {checkpoint} would be in the mean twice (named by the checkpoint given "
                             "and a --with, or by two --with, or within their last --average checkpoints): name each once")
        seen.add(checkpoint)
    return taken


def _say_averaged(runs: list[Path], taken: list[list[Path]]) -> None:
    """Which steps of which runs the mean takes (on stderr)."""
    def steps(checkpoints: list[Path]) -> str:
        return ", ".join(match[1] if (match := STEP_DIR.match(d.name)) else d.name for d in checkpoints)

    if len(taken) == 1:
        print(f"posttrain export: the mean of steps {steps(taken[0])}", file=sys.stderr)
    elif taken:
        where = [run.parent.parent if STEP_DIR.match(run.name) else run for run in runs]
        print("posttrain export: the mean of " + "; ".join(f"steps {steps(c)} of {w}" for c, w in zip(taken, where)), file=sys.stderr)


def _last_checkpoints(directory: Path, count: int) -> list[Path]:
    """``directory`` (a ``global_step_N`` checkpoint) and the complete ones before it in its run, ``count`` in
    all, oldest first."""
    if count == 1:
        return [directory]
    try:
        step = step_of(directory)
    except CheckpointError as err:
        raise InputError(f"--average {count}: {err}: the checkpoints averaged are found by their steps in a run's "
                         "checkpoints directory; give the run directory or one of its global_step_N") from err
    manager = CheckpointManager(directory.parent)
    earlier = [s for s in manager.complete_steps() if s < step][-(count - 1):]
    if len(earlier) < count - 1:
        kept = ", ".join(map(str, [*earlier, step]))
        raise InputError(f"--average {count}: {directory.parent} keeps {len(earlier) + 1} complete checkpoint(s) up to step "
                         f"{step} (steps {kept}): average {len(earlier) + 1} or fewer, or train with a larger "
                         "trainer.max_ckpt_to_keep (a run keeps its last ones, one every trainer.save_freq steps)")
    return [manager.step_dir(s) for s in earlier] + [directory]
