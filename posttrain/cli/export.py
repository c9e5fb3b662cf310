"""``posttrain export``: a run's policy checkpoint as a plain Hugging Face directory (safetensors,
config, tokenizer; LoRA merged) that transformers and vLLM load. Runs in this process, no Ray.
``--toward MODEL --weight W`` writes the policy moved back toward the model it was trained from,
``MODEL + W * (policy - MODEL)`` weight by weight (``interpolate_hf``: WiSE-FT, WARP)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from posttrain.config import load_config
from posttrain.errors import InputError
from posttrain.trainer.checkpoint import checkpoint_dir
from posttrain.workers.engines import training_engine

SFT_EXPORT = "export"  # a `posttrain sft` run's exported policy, inside its run directory


def export_checkpoint(path: str | Path, out_dir: str | Path, toward: str | Path | None = None,
                      weight: float | None = None) -> Path:
    if (toward is None) != (weight is None):
        raise InputError("give --toward MODEL and --weight W together (W from 0, MODEL itself, to 1, the checkpoint's policy), or neither")
    if weight is not None and not 0.0 <= weight <= 1.0:
        raise InputError(f"--weight {weight}: give a number from 0 (the --toward model) to 1 (the checkpoint's policy)")
    base = _model_dir(Path(toward)) if toward is not None else None
    directory = checkpoint_dir(path)
    config = load_config([directory / "config.yaml"], checks=None)
    arr = config.actor_rollout_ref
    engine = training_engine(
        # nothing is trained here: no clipping (a run saved before grad_clip had to be > 0 may hold 0)
        arr.model.path, arr.model, arr.actor.optim, dtype=arr.actor.dtype, grad_clip=None,
        total_steps=config.trainer.total_training_steps, seed=config.trainer.seed, device="cpu",
    )
    engine.load_checkpoint(directory / "actor")
    if base is None:
        return engine.export_hf(Path(out_dir))
    from posttrain.engines.training.weights import interpolate_hf

    Path(out_dir).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(out_dir).parent, prefix=".export-") as tuned:
        engine.export_hf(Path(tuned))
        try:
            return interpolate_hf(base, tuned, weight, out_dir)
        except ValueError as err:
            raise InputError(f"--toward {toward}: {err}") from err


def _model_dir(path: Path) -> Path:
    """A Hugging Face directory, or an SFT run's directory (its ``export/``)."""
    if (path / SFT_EXPORT).is_dir():
        path = path / SFT_EXPORT
    if not (path / "config.json").is_file():
        raise InputError(f"--toward {path}: not a Hugging Face model directory (no config.json): give the model the run "
                         "was trained from as a local directory, e.g. an SFT run's directory or its export/")
    return path
