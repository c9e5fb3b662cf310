"""``posttrain export``: a run's policy checkpoint as a plain Hugging Face directory (safetensors,
config, tokenizer; LoRA merged) that transformers and vLLM load. Runs in this process, no Ray."""

from __future__ import annotations

from pathlib import Path

from posttrain.config import load_config
from posttrain.trainer.checkpoint import checkpoint_dir
from posttrain.workers.engines import training_engine


def export_checkpoint(path: str | Path, out_dir: str | Path) -> Path:
    directory = checkpoint_dir(path)
    config = load_config([directory / "config.yaml"], checks=None)
    arr = config.actor_rollout_ref
    engine = training_engine(
        # nothing is trained here: no clipping (a run saved before grad_clip had to be > 0 may hold 0)
        arr.model.path, arr.model, arr.actor.optim, dtype=arr.actor.dtype, grad_clip=None,
        total_steps=config.trainer.total_training_steps, seed=config.trainer.seed, device="cpu",
    )
    engine.load_checkpoint(directory / "actor")
    return engine.export_hf(Path(out_dir))
