"""``posttrain eval``: validation only, on the run skeleton's start and stop.

The configured model, or the policy of a checkpoint, runs the RL task's validation (the same
rollout, validator and metrics as training: ``trainer/validation.py``) with the workers started and
stopped as a run does (:func:`~posttrain.trainer.skeleton.workers_up`). No step, no run directory
of its own: the metrics are printed, each accuracy with its 95 % interval, and the episodes written
where ``--dump-episodes`` says. ``posttrain compare`` (:func:`compare_evaluations`) sets two such
episode files side by side: the difference of their accuracies on the same items, with a paired
bootstrap interval.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console

from posttrain.config.schema import PosttrainConfig
from posttrain.trainer.export import checkpoint_dir
from posttrain.trainer.roles import Roles
from posttrain.trainer.run import exit_code_of, start_ray
from posttrain.trainer.setup import RolloutService, rollout_setup
from posttrain.trainer.skeleton import workers_up
from posttrain.trainer.intervals import interval_names, paired_difference, wilson
from posttrain.trainer.validation import episode_rows, summarize_rows, summary_line, write_jsonl


def run_evaluation(config: PosttrainConfig, checkpoint: str | None, dump_episodes: str | None = None, by: str | None = None) -> int:
    """Validation only: the configured model, or the policy of ``checkpoint``, on data.val_files.

    ``dump_episodes``: write every validation episode to this JSON-lines file (the layout
    ``posttrain sft`` reads); ``by``: also print the summary per value of ``extra_info[by]``.
    """
    import ray

    console = Console()
    try:
        setup = rollout_setup(config)
    except (ValueError, FileNotFoundError) as err:
        print(f"posttrain: {err}", file=sys.stderr)
        return 2
    if setup.validator is None:
        console.print("posttrain: no validation data: set data.val_files (or data.builtin)")
        return 2

    def load_policy(roles: Roles) -> None:
        if checkpoint:
            directory = checkpoint_dir(checkpoint)
            roles.actor.load_checkpoint(str(directory / "actor"), 1)
            console.print(f"policy from {directory}")

    start_ray(config.trainer, None)  # an evaluation keeps the run directory's link to its training logs
    try:
        with workers_up(config, setup.total_steps, [RolloutService(setup.rollout)], load_policy) as roles:
            metrics = setup.validator(roles)  # no step: eval writes episodes only where --dump-episodes says
    except Exception as err:  # an evaluation keeps no log file: known errors are one line, bugs keep their traceback
        if (code := exit_code_of(err)) is None:
            raise
        print(f"posttrain: {err}", file=sys.stderr)
        return code
    finally:
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
    return 0


def item_key(row: dict) -> str:
    """What makes two episode rows the same item: the data source, the dataset row (``extra_info.index``,
    where the data has it: two held-out doctor cases can share a prompt and a diagnosis), the prompt
    (the messages before the first answer) and the ground truth."""
    messages = row.get("messages") or []
    first_answer = next((i for i, message in enumerate(messages) if message.get("role") == "assistant"), len(messages))
    index = (row.get("extra_info") or {}).get("index")
    return json.dumps([row.get("data_source"), index, messages[:first_answer], row.get("ground_truth")],
                      sort_keys=True, ensure_ascii=False)


def item_accuracies(path: Path) -> tuple[dict[str, float], dict[str, dict]]:
    """Each item's accuracy in an episodes file (the mean over its samples), and one of its rows."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (write one with `posttrain eval --dump-episodes FILE.jsonl`, or use "
                                "a run's validation/step_N.jsonl)")
    successes: dict[str, list[float]] = {}
    rows: dict[str, dict] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            success = float(bool(row["success"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path} line {number} is not an episode row with a 'success' field ({err})") from err
        key = item_key(row)
        successes.setdefault(key, []).append(success)
        rows.setdefault(key, row)
    return {key: sum(values) / len(values) for key, values in successes.items()}, rows


def item_groups(keys: list[str], rows: dict[str, dict], by: str | None) -> dict[str, list[str]]:
    """``keys`` under ``"all"`` and, with ``by``, under ``"<by>=<value>"`` per value of the row's ``extra_info[by]``."""
    groups = {"all": list(keys)}
    if by is not None:
        for key in keys:
            groups.setdefault(f"{by}={(rows[key].get('extra_info') or {}).get(by)}", []).append(key)
    return groups


def compare_evaluations(first: Path, second: Path, by: str | None = None) -> int:
    """``posttrain compare A.jsonl B.jsonl``: each evaluation's accuracy on the items both hold, with
    its 95 % Wilson interval, and B − A with a paired bootstrap interval (per ``extra_info[by]`` too)."""
    console = Console(highlight=False)
    try:
        (a, rows), (b, _) = item_accuracies(first), item_accuracies(second)
    except (FileNotFoundError, ValueError) as err:
        print(f"posttrain: {err}", file=sys.stderr)
        return 2
    common = [key for key in a if key in b]
    if not common:
        print(f"posttrain: {first} and {second} hold no item in common (the same prompt, data source and ground truth): "
              "compare two evaluations of the same held-out set", file=sys.stderr)
        return 2
    if len(common) < max(len(a), len(b)):
        console.print(f"posttrain: comparing the {len(common)} items both files hold ({len(a)} in {first}, {len(b)} in {second})")
    for group, keys in item_groups(common, rows, by).items():
        lines = [f"{group} ({len(keys)} items)"]
        for label, accuracies in (("A", a), ("B", b)):
            values = [accuracies[key] for key in keys]
            low, high = wilson(sum(values), len(values))
            lines.append(f"  {label} accuracy {sum(values) / len(values):.3f} [{low:.3f}, {high:.3f}]")
        difference, low, high = paired_difference([a[key] for key in keys], [b[key] for key in keys])
        lines.append(f"  B - A {difference:+.3f}, paired 95% interval [{low:+.3f}, {high:+.3f}]")
        console.print("\n".join(lines))
    return 0
