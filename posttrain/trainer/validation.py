"""Validation: the RL task's rollouts on held-out prompts, scored as in training, and what they leave behind.

One :class:`Validator` serves every loop that validates a policy (the RL trainer every
``test_freq`` steps, the SFT trainer before and after, ``posttrain eval``): the same prompts, the
same rollout (single-turn or agent), the same metrics (``val/<source>/acc/mean@n`` ...), and the
samples for the run's report. Each validation's episodes are written to
``<run dir>/validation/step_N.jsonl`` (:func:`episode_rows`: messages, reward, success, turns and
counters, ``extra_info``), to read what the policy did, summarise by a field (:func:`summarize_rows`)
or imitate its own successful episodes.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from posttrain import keys
from posttrain.algos import masked_mean
from posttrain.data import PromptDataLoader
from posttrain.engines.training.inputs import response_attention_mask
from posttrain.errors import InputError, MissingFileError
from posttrain.metrics import merge, values
from posttrain.protocol import Batch
from posttrain.rewards.episodes_file import numbered_rows
from posttrain.rollout import Rollout, join_rollouts
from posttrain.rollout.batching import sample_accuracy
from posttrain.trainer.intervals import interval_metrics, wilson
from posttrain.trainer.report import Sample
from posttrain.trainer.roles import Roles


class Validator:
    """Validation rollouts over ``loader`` (n samples per prompt, validation sampling)."""

    def __init__(self, rollout: Rollout, loader: PromptDataLoader, n: int, tokenizer: PreTrainedTokenizerBase, samples_in_report: int,
                 episodes_dir: Path | None = None) -> None:
        self.rollout, self.loader, self.n = rollout, loader, n
        self.episodes_dir = episodes_dir  # each validation's episodes go to <dir>/step_N.jsonl
        self.tokenizer, self.samples_in_report = tokenizer, samples_in_report
        self.history: list[dict[str, float]] = []
        self.first_samples: list[Sample] = []
        self.last_samples: list[Sample] = []
        self.last_batch: Batch | None = None

    def __call__(self, roles: Roles, step: int | None = None) -> dict[str, float]:
        pieces, rollout_metrics = [], []
        total, done, start = len(self.loader.dataset), 0, time.monotonic()
        self.loader.load_state_dict({**self.loader.state_dict(), "epoch": 0, "index": 0})  # from the first row, whatever stopped before
        for prompts in self.loader:
            repeated = prompts.repeat(self.n, interleave=True)
            repeated.meta[keys.ROW_OFFSET] = done * self.n  # seeded as one batch of the whole set would be
            piece, piece_metrics = self.rollout(roles.for_rollout(), repeated, validate=True)
            pieces.append(piece)
            rollout_metrics.append(piece_metrics)
            done += len(prompts)
            if len(self.loader) > 1:  # a long validation says how far it is, one line per batch
                print(f"validation: {done}/{total} prompts in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        self.loader.load_state_dict({**self.loader.state_dict(), "epoch": 0, "index": 0})
        batch = join_rollouts(pieces, self.tokenizer.pad_token_id)  # each batch's prompts were padded to its own longest
        metrics = validation_metrics(batch, self.n) | {f"val/{name}": value for name, value in values(merge(rollout_metrics)).items()}
        samples = self._samples(batch)
        if not self.first_samples:
            self.first_samples = samples
        self.last_samples = samples
        self.last_batch = batch
        self.history.append(metrics)
        if self.episodes_dir is not None and step is not None:
            write_jsonl(episode_rows(batch, self.tokenizer), self.episodes_dir / f"step_{step}.jsonl")
        return metrics

    def _samples(self, batch: Batch) -> list[Sample]:
        count = min(self.samples_in_report, len(batch))
        scores = batch[keys.TOKEN_SCORES].sum(-1)
        rows = list(range(count))
        if count and keys.EPISODE_STATS in batch:  # show at least one episode that acted (a search, a tool call) if any did
            acted = [row for row in range(len(batch)) if (batch[keys.EPISODE_STATS][row] or {}).get("num_turns", 1) > 1]  # a single turn acts once
            if acted and not set(acted) & set(rows):
                rows[-1] = acted[0]
        samples = []
        for row in rows:
            length = int(response_attention_mask(batch)[row].sum())  # agent turns and observations
            prompt = self.tokenizer.decode(batch[keys.PROMPT_IDS][row][batch[keys.PROMPT_MASK][row].bool()], skip_special_tokens=False)
            response = self.tokenizer.decode(batch[keys.RESPONSE_IDS][row, :length], skip_special_tokens=True)
            samples.append(Sample(prompt, response, float(scores[row])))
        return samples


class RLValidation:
    """The RL trainers' validation: the validator before training (``trainer.val_before_train``) and
    every ``trainer.test_freq`` steps (and at the last); ``before`` runs first (an asynchronous run
    syncs its trainer's rollout engine, which samples only for validation)."""

    def __init__(self, validator: Validator, test_freq: int, before_training: bool,
                 before: Callable[[Roles, int], object] | None = None) -> None:
        self.validator, self.test_freq, self.before_training, self.before = validator, test_freq, before_training, before

    @property
    def history(self) -> list[dict[str, float]]:
        return self.validator.history

    @property
    def first_samples(self) -> list[Sample]:
        return self.validator.first_samples

    @first_samples.setter
    def first_samples(self, samples: list[Sample]) -> None:
        self.validator.first_samples = samples

    @property
    def last_samples(self) -> list[Sample]:
        return self.validator.last_samples

    def due(self, step: int, total_steps: int) -> bool:
        return self.test_freq > 0 and (step % self.test_freq == 0 or step == total_steps)

    def __call__(self, roles: Roles, step: int) -> dict[str, float]:
        if self.before is not None:
            self.before(roles, step)
        return self.validator(roles, step)


RUBRIC_COLUMNS = "reward_extra/rubric/"  # a rubric's parts, per sample (rewards/rubric.py)


def episode_rows(batch: Batch, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """One JSON-ready dict per validation row: data_source, extra_info, ground_truth, reward,
    success, ``messages`` (the conversation, in the layout ``posttrain sft`` reads), ``response_tokens``
    (the policy's own tokens, what ``response_length/*`` counts), for agent episodes ``stats``
    (turns, valid actions, the environment's counters), and with a rubric ``rubric`` (each part's score)."""
    rewards = batch[keys.TOKEN_SCORES].sum(-1).tolist()
    success = sample_accuracy(batch)
    # the policy's own tokens (what response_length/* counts); a batch not yet made for training: its response
    trained = (batch[keys.RESPONSE_MASK] if keys.RESPONSE_MASK in batch else response_attention_mask(batch)).sum(-1).tolist()
    # each part's score; not its failures, nor a judge part's rule verdict or unreadable replies (rubric/<name>/...)
    parts = [name for name in batch.non_tensors if name.startswith(RUBRIC_COLUMNS) and "/" not in name[len(RUBRIC_COLUMNS):]]
    rows = []
    for row in range(len(batch)):
        # a single turn's counters, where it has them (a mixture's single-turn rows beside episodes: None)
        stats = dict(batch[keys.EPISODE_STATS][row] or {}) if keys.EPISODE_STATS in batch else {}
        if keys.TRANSCRIPT in batch and batch[keys.TRANSCRIPT][row] is not None:
            messages = list(batch[keys.TRANSCRIPT][row])
        else:
            length = int(response_attention_mask(batch)[row].sum())
            response = tokenizer.decode(batch[keys.RESPONSE_IDS][row, :length], skip_special_tokens=True)
            messages = [*batch[keys.RAW_PROMPT][row], {"role": "assistant", "content": response}]
        rows.append({
            "data_source": str(batch[keys.DATA_SOURCE][row]), "extra_info": _plain(batch[keys.EXTRA_INFO][row]),
            "ground_truth": _plain(batch[keys.GROUND_TRUTH][row]), "reward": float(rewards[row]),
            "success": bool(success[row]), "messages": messages, "stats": stats, "response_tokens": int(trained[row]),
        } | ({"rubric": {name[len(RUBRIC_COLUMNS):]: _plain(batch[name][row]) for name in parts}} if parts else {})
          | ({"source": str(batch[keys.SOURCE][row])} if keys.SOURCE in batch else {}))
    return rows


def training_rows(batch: Batch, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """A training step's scored rollouts (``trainer.rollout_data_dir``): :func:`episode_rows` with each
    sample's group (``uid``), its ``advantage`` (the mean over its trained tokens; GRPO's is the same on
    every token) and, with ``algorithm.guidance``, ``guided`` (the row's reference answer, not sampled)."""
    advantages = masked_mean(batch[keys.ADVANTAGES], batch[keys.RESPONSE_MASK], dim=-1).tolist() if keys.ADVANTAGES in batch else None
    guided = batch[keys.GUIDED].tolist() if keys.GUIDED in batch else None
    return [row | {"uid": str(batch[keys.UID][index])} | ({} if advantages is None else {"advantage": float(advantages[index])})
            | ({} if guided is None else {"guided": bool(guided[index])})
            for index, row in enumerate(episode_rows(batch, tokenizer))]


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return path


def summarize_rows(rows: Sequence[dict[str, Any]], by: str | None = None) -> dict[str, dict[str, float]]:
    """Means per value of ``by`` (:func:`row_field`: ``extra_info[by]``, or a mixture's ``source``; all rows under ``"all"``): ``episodes``, ``accuracy``
    (with its 95 % Wilson interval, ``accuracy_low`` / ``accuracy_high``), ``reward``, every stat, and ``valid_action_ratio`` (valid actions over turns)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups["all"].append(row)
        if by is not None:
            groups[f"{by}={row_field(row, by)}"].append(row)
    table = {}
    for name, members in groups.items():
        stats = sorted({key for row in members for key in row["stats"]})
        successes = sum(bool(row["success"]) for row in members)
        low, high = wilson(successes, len(members))
        summary = {
            "episodes": float(len(members)),
            "accuracy": successes / len(members), "accuracy_low": low, "accuracy_high": high,
            "reward": float(np.mean([row["reward"] for row in members])),
        } | {key: float(np.mean([row["stats"].get(key, 0.0) for row in members])) for key in stats}
        if "num_turns" in stats:
            turns = sum(row["stats"].get("num_turns", 0.0) for row in members)
            summary["valid_action_ratio"] = sum(row["stats"].get("valid_actions", 0.0) for row in members) / max(turns, 1.0)
        table[name] = summary
    return table


def summary_line(summary: dict[str, float]) -> str:
    """One group of :func:`summarize_rows` as text: ``episodes 64 · accuracy 0.500 [0.380, 0.620] · reward …``."""
    parts = []
    for name, value in summary.items():
        if name in ("accuracy_low", "accuracy_high"):
            continue
        text = f"{name} {value:.3f}"
        if name == "accuracy":
            text += f" [{summary['accuracy_low']:.3f}, {summary['accuracy_high']:.3f}]"
        parts.append(text)
    return " · ".join(parts)


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (as Parquet columns arrive) as JSON-ready Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validation_metrics(batch: Batch, n: int) -> dict[str, float]:
    """Per data source (a mixture's: per source, its name): ``val/<source>/acc/mean@n`` (mean over all samples) and ``best@n`` (any of a
    prompt's n samples right), and ``maj@n`` when the scores carry predictions (``reward_extra/pred``),
    each with its 95 % interval (``acc_low`` / ``acc_high``, trainer/intervals.py).

    Accuracy is :func:`sample_accuracy`.
    """
    scores = batch[keys.TOKEN_SCORES].sum(-1).numpy()
    acc = sample_accuracy(batch)
    predictions = batch["reward_extra/pred"] if "reward_extra/pred" in batch else None
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    sources = batch[keys.SOURCE] if keys.SOURCE in batch else batch[keys.DATA_SOURCE]
    # maj@n for the sources whose scorer reports predictions (in a mixture, others' rows hold None)
    predicted = set() if predictions is None else {source for source, vote in zip(sources, predictions) if vote is not None}
    for row, (source, uid) in enumerate(zip(sources, batch[keys.UID])):
        groups[(source, uid)].append(row)
    per_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    sample_successes: dict[str, list[float]] = defaultdict(list)  # mean@n's trials are the samples
    for (source, _), rows in groups.items():
        sample_successes[source].extend(acc[rows].tolist())
        per_source[source]["mean"].append(float(acc[rows].mean()))
        per_source[source]["best"].append(float(acc[rows].max()))
        per_source[source]["reward"].append(float(scores[rows].mean()))
        if predictions is not None and source in predicted:
            votes = [predictions[r] for r in rows]
            # NaN: no answer was extracted, which wins no vote; None: a row whose scorer reports no predictions
            answered = [vote for vote in votes if vote is not None and vote == vote]
            winner = max(set(answered), key=answered.count) if answered else None
            majority = [acc[r] for r, vote in zip(rows, votes) if answered and vote == winner]
            per_source[source]["maj"].append(float(np.mean(majority)) if majority else 0.0)
    metrics = {}
    for source, by_name in per_source.items():
        for name, numbers in by_name.items():
            label = f"val/{source}/reward/mean@{n}" if name == "reward" else f"val/{source}/acc/{name}@{n}"
            metrics[label] = float(np.mean(numbers))
            if name != "reward":  # its 95 % Wilson interval (trainer/intervals.py): mean@n over samples, the others over prompts
                trials = sample_successes[source] if name == "mean" else numbers
                metrics |= interval_metrics(label, sum(trials), len(trials))
    return metrics


# ---- reading episode files back (posttrain compare, recipes' tables) ------------------------------


def item_key(row: dict) -> str:
    """What makes two episode rows the same item: the data source, the dataset row (``extra_info.index``,
    where the data has it: two held-out doctor cases can share a prompt and a diagnosis), the prompt
    (the messages before the first answer), the tools it was offered (``extra_info.tools``, where the row
    has them: a question asked with other functions is another item, as in two files of one split whose
    indexes overlap) and the ground truth."""
    messages = row.get("messages") or []
    first_answer = next((i for i, message in enumerate(messages) if message.get("role") == "assistant"), len(messages))
    extra_info = row.get("extra_info") or {}
    item = [row.get("data_source"), extra_info.get("index"), messages[:first_answer], row.get("ground_truth")]
    item += [extra_info["tools"]] if "tools" in extra_info else []
    item += [row["source"]] if "source" in row else []  # a mixture's: two sources may hold the same rows
    return json.dumps(item, sort_keys=True, ensure_ascii=False)


def item_accuracies(path: Path) -> tuple[dict[str, float], dict[str, dict]]:
    """Each item's accuracy in an episodes file (the mean over its samples), and one of its rows."""
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file (write one with `posttrain eval --dump-episodes FILE.jsonl`, or use "
                                "a run's validation/step_N.jsonl)")
    successes: dict[str, list[float]] = {}
    rows: dict[str, dict] = {}
    for number, row in numbered_rows(path):
        if not (isinstance(row.get("success"), (bool, int, float)) and row["success"] in (0, 1)):
            raise InputError(f"{path} line {number} is not an episode row with a 'success' field of true or false (or 1 or 0)")
        if not isinstance(row.get("messages", []), list) or not isinstance(row.get("extra_info") or {}, dict):
            raise InputError(f"{path} line {number} is not an episode row: its messages must be a list and its extra_info an object")
        success = float(row["success"])
        key = item_key(row)
        successes.setdefault(key, []).append(success)
        rows.setdefault(key, row)
    return {key: sum(values) / len(values) for key, values in successes.items()}, rows


def row_field(row: dict, by: str) -> Any:
    """An episode row's value of ``by``: its ``extra_info[by]``, or for ``source`` and ``data_source`` the row's
    own field (a mixture's source, the data source)."""
    return row.get(by) if by in ("source", "data_source") else (row.get("extra_info") or {}).get(by)


def item_groups(keys: list[str], rows: dict[str, dict], by: str | None) -> dict[str, list[str]]:
    """``keys`` under ``"all"`` and, with ``by``, under ``"<by>=<value>"`` per :func:`row_field`."""
    groups = {"all": list(keys)}
    if by is not None:
        for key in keys:
            groups.setdefault(f"{by}={row_field(rows[key], by)}", []).append(key)
    return groups
