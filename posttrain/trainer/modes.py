"""The one place that picks a run's mode from ``trainer.mode``: each mode builds its own
:class:`~posttrain.trainer.run.RunParts` (``trainer/sync.py``, ``trainer/async_/mode.py``); nothing
else branches on the mode's name (the config's own per-mode rules, below this layer, are
``config/validate.py``'s ``MODE_RULES`` table)."""

from __future__ import annotations

from pathlib import Path

from posttrain.config.schema import PosttrainConfig
from posttrain.trainer.run import Run
from posttrain.trainer.stopping import StopSignal


def training_run(config: PosttrainConfig, stop: StopSignal | None = None) -> Run:
    """The sync or async mode (``trainer.mode``) on the run skeleton, every check that needs no worker done."""
    from posttrain.trainer.async_.mode import async_parts
    from posttrain.trainer.setup import rollout_setup
    from posttrain.trainer.sync import sync_parts

    stop = stop or StopSignal(Path(config.trainer.default_local_dir))
    setup = rollout_setup(config)
    return Run(async_parts(setup, stop) if config.trainer.mode == "async" else sync_parts(setup), stop)
