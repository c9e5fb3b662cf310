"""``posttrain eval``: validation only, on the run skeleton's start and stop.

The configured model, or the policy of a checkpoint, runs the RL task's validation (the same
rollout, validator and metrics as training: ``trainer/validation.py``) with the workers started and
stopped as a run does (:func:`~posttrain.trainer.run.workers_up`). No step, no run directory
of its own: the metrics are printed, each accuracy with its 95 % interval, and the episodes written
where ``--dump-episodes`` says (``posttrain compare`` sets two such files side by side:
``cli/compare.py``).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from posttrain.cli.train import start_ray
from posttrain.config.schema import PosttrainConfig
from posttrain.errors import InputError
from posttrain.trainer import provenance
from posttrain.trainer.checkpoint import checkpoint_dir
from posttrain.trainer.intervals import interval_names
from posttrain.trainer.roles import Roles
from posttrain.trainer.run import workers_up
from posttrain.trainer.setup import RolloutService, rollout_setup
from posttrain.trainer.validation import episode_rows, summarize_rows, summary_line, write_jsonl


def run_evaluation(config: PosttrainConfig, checkpoint: str | None, dump_episodes: str | None = None, by: str | None = None) -> int:
    """Validation only: the configured model, or the policy of ``checkpoint``, on data.val_files.

    ``dump_episodes``: write every validation episode to this JSON-lines file (the layout
    ``posttrain sft`` reads); ``by``: also print the summary per value of ``extra_info[by]``.
    """
    import ray

    console = Console()
    setup = rollout_setup(config, training=False)  # what it refuses goes up to main, as one line
    if setup.validator is None:
        raise InputError("no validation data: set data.val_files (or data.builtin)")

    def load_policy(roles: Roles) -> None:
        if checkpoint:
            directory = checkpoint_dir(checkpoint)
            roles.actor.load_checkpoint(str(directory / "actor"), 1)
            console.print(f"policy from {directory}")

    start_ray(config.trainer, None)  # an evaluation keeps the run directory's link to its training logs
    try:
        with workers_up(config, setup.total_steps, [RolloutService(setup.rollout)], load_policy) as roles:
            metrics = setup.validator(roles)  # no step: eval writes episodes only where --dump-episodes says
    finally:  # an evaluation keeps no log file: main reports a known error as one line, a bug keeps its traceback
        ray.shutdown()
    for name, value in sorted(metrics.items()):
        if "/acc_low/" in name or "/acc_high/" in name:
            continue  # shown beside their accuracy
        low, high = (metrics.get(key) for key in interval_names(name)) if "/acc/" in name else (None, None)
        console.print(f"{name}: {value:.4f}" + (f"  (95% interval {low:.4f} to {high:.4f})" if low is not None else ""), highlight=False)
    rows = episode_rows(setup.validator.last_batch, setup.tokenizer)
    if by is not None:
        for group, summary in summarize_rows(rows, by).items():
            console.print(f"{group}: {summary_line(summary)}", highlight=False)
    if dump_episodes:
        console.print(f"episodes: {write_jsonl(rows, dump_episodes)}")
        folder = Path(dump_episodes).parent
        if not (folder / "config.yaml").exists():  # beside the episodes, unless that is a training run's directory (its own)
            provenance.write(folder)
    return 0
