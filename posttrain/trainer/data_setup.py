"""The run's datasets and loaders, from ``data.*`` (built-in datasets prepared once into the cache)."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from posttrain import keys
from posttrain.config.mixture import MixtureSource
from posttrain.config.schema import DataConfig
from posttrain.data import PromptDataLoader, RLDataset, prepare, split_dev
from posttrain.data.loader import row_of_uid
from posttrain.data.preparers import PREPARERS, check_options, get_preparer
from posttrain.data.sampler import Curriculum, StratifiedSampler, row_value
from posttrain.errors import InputError, PosttrainError, Problem
from posttrain.models import build_atomically, cache_root
from posttrain.protocol import Batch
from posttrain.rollout.batching import sample_accuracy
from posttrain.rollout.toolbox import tool_schemas

logger = logging.getLogger(__name__)
# validation's batch when data.val_batch_size is null: the progress line comes after each (trainer/validation.py)
VALIDATION_CHUNK = 256


@dataclass
class RunData:
    train: PromptDataLoader | None  # None for an evaluation: it reads no training set
    val: PromptDataLoader | None
    val_dataset: RLDataset | None
    # the first training file's directory (a search corpus may sit beside it); an evaluation's first validation file's;
    # a mixture's: each source's, by name
    data_dir: Path | dict[str, Path]


def resolve_files(data: DataConfig, training: bool = True) -> tuple[list[str], list[str]]:
    """(train files, validation files): as configured, or a built-in dataset's splits. An evaluation
    (``training`` False) needs validation files only."""
    if data.train_files or (not training and data.val_files and not data.builtin):
        return list(data.train_files), list(data.val_files)
    if not data.builtin and not training:
        raise InputError("no validation data: set data.val_files=[path.parquet,...] (or data.builtin)")
    if not data.builtin:
        raise InputError(
            "no training data: set data.train_files=[path.parquet,...] (verl's row format; "
            "`posttrain prepare` writes it) or data.builtin=arithmetic|gsm8k"
        )
    options = dict(data.builtin_options)
    tag = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode() + _dataset_sources(data.builtin, options)).hexdigest()[:10]
    directory = build_atomically(cache_root() / "data" / f"{data.builtin}-{tag}", lambda tmp: _prepare(data.builtin, tmp, options))
    return [str(directory / "train.parquet")], split_files(data, "val_files", directory) or [str(directory / "test.parquet")]


def builtin_option_problems(data: DataConfig) -> list[Problem]:
    """What the built-in dataset's preparer would refuse of ``data.builtin`` and ``data.builtin_options`` before it
    reads a file (``preparers.check_options``): found by the config check, not when the run prepares its data."""
    if not data.builtin or data.train_files:  # train_files: the built-in dataset is not read
        return []
    if data.builtin not in PREPARERS:
        return [Problem("data.builtin", data.builtin, f"unknown dataset; choose one of {', '.join(sorted(PREPARERS))}")]
    try:
        check_options(data.builtin, dict(data.builtin_options))
    except PosttrainError as error:  # a refused option, or a library the preparer needs that is not installed
        return [Problem("data.builtin_options", dict(data.builtin_options), str(error))]
    return []


def split_files(data: DataConfig, key: str, directory: Path | None) -> list[str]:
    """``data.<key>``'s files; with a built-in dataset written in ``directory``, a bare file name names another of
    its splits (test_longer.parquet). InputError for one that is neither."""
    files = list(getattr(data, key))
    if directory is None:
        return files
    files = [f if Path(f).exists() or Path(f).name != f else str(directory / f) for f in files]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        splits = sorted(path.name for path in directory.glob("*.parquet"))
        raise InputError(f"data.{key} {missing}: no such file, nor a split of the built-in dataset {data.builtin!r} ({', '.join(splits)})")
    return files


def _dataset_sources(name: str, options: dict[str, Any]) -> bytes:
    """What a built-in dataset depends on besides its options, so that a change writes it anew: the
    preparers' sources (one reads another's: bfcl's ``outside_irrelevance`` rows are GSM8K's problems) and the data
    vendored in posttrain, the environments its experts play and the tools they call (``posttrain/agents``,
    ``posttrain/tools``), and the contents of any option that names a file (``source_file``)."""
    preparer = Path(inspect.getfile(get_preparer(name)))
    others = sorted(path for path in [*preparer.parent.glob("*.py"), *(preparer.parents[1] / "vendor").rglob("*")]
                    if path != preparer and path.is_file())
    agents = sorted(path for folder in ("agents", "tools") for path in (preparer.parents[2] / folder).rglob("*.py"))
    files = [value for value in options.values() if isinstance(value, (str, Path)) and Path(value).is_file()]
    return b"".join(Path(path).read_bytes() for path in [preparer, *others, *agents, *files])


def _prepare(name: str, out_dir: Path, options: dict[str, Any]) -> None:
    prepare(name, out_dir, **options)


def build_run_data(data: DataConfig, tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None, training: bool = True,
                   tool_format: str = "auto") -> RunData:
    """Training and validation prompts; ``tools``: the schemas a tool-calling agent is told about in each
    prompt, in ``tool_format`` (``env.tool_format``). ``training`` False (an evaluation): the validation prompts only, and none of the training
    batch's rules (``data.train_batch_size`` against the training set's size) apply. With ``data.dev_size``
    the validation prompts are that many rows held back from the training files (``data.val_files`` unread), and the
    rows of ``data.dev_files`` beside them."""
    train_set, val_set, data_dir = _datasets(data, tokenizer, tools, training, tool_format)
    if not training:
        return RunData(None, *_validation(data, val_set, tokenizer), data_dir)
    return RunData(_training_loader(data, train_set, tokenizer, build_sampler(data, train_set)), *_validation(data, val_set, tokenizer), data_dir)


def _datasets(data: DataConfig, tokenizer: Any, tools: Sequence[dict[str, Any]] | None, training: bool,
              tool_format: str) -> tuple[RLDataset | None, RLDataset | None, Path]:
    """(training rows or None for an evaluation, validation rows or None, the data's directory)."""
    held_back = data.dev_size > 0
    train_files, val_files = resolve_files(data, training or held_back)
    common = {
        "prompt_key": data.prompt_key, "max_prompt_length": data.max_prompt_length,
        "truncation": data.truncation, "filter_overlong_prompts": data.filter_overlong_prompts, "tools": tools,
        "tool_format": tool_format,
    }
    if held_back:
        train_set, val_set = split_dev(RLDataset(train_files, tokenizer, **common), data.dev_size, data.seed)
        logger.info("validation on %d development rows held back from %s (data.dev_size; data.val_files unread)", len(val_set), train_files)
        if data.dev_files:
            extra = RLDataset(split_files(data, "dev_files", Path(train_files[0]).parent if data.builtin and not data.train_files else None), tokenizer, **common)
            val_set = val_set.with_samples([*val_set.samples, *extra.samples])
            logger.info("and on the %d rows of data.dev_files %s", len(extra), list(data.dev_files))
    else:
        train_set = RLDataset(train_files, tokenizer, **common) if training else None
        val_set = RLDataset(val_files, tokenizer, **common) if val_files else None
    return train_set, val_set, Path((train_files or val_files or ["."])[0]).parent


def _training_loader(data: DataConfig, train_set: RLDataset, tokenizer: Any, sampler: StratifiedSampler | None) -> PromptDataLoader:
    if len(train_set) < data.train_batch_size:
        raise InputError(
            f"data.train_batch_size={data.train_batch_size} but the training set has only {len(train_set)} prompts "
            f"(after filtering {train_set.num_filtered} overlong ones); lower the batch size or add data"
        )
    return PromptDataLoader(train_set, data.train_batch_size, tokenizer.pad_token_id, shuffle=data.shuffle, seed=data.seed, sampler=sampler)


def build_mixture_data(data: DataConfig, sources: Sequence[MixtureSource], tokenizer: Any, training: bool = True) -> RunData:
    """A mixture's rows (config/mixture.py): each source's datasets built from its own ``data`` with its own
    tools, every row tagged with its source, joined; batches of the run's ``data`` settings, each holding the
    sources by weight (the sampler's strata: a source each, its share its weight's). ``data_dir``: each
    source's directory, by name."""
    trains, vals, dirs = [], [], {}
    for source in sources:
        own = source.config
        try:
            train_set, val_set, dirs[source.name] = _datasets(own.data, tokenizer, tool_schemas(own.env), training, own.env.tool_format)
        except InputError as error:
            raise InputError(f"mixture source {source.name!r}: {error}") from None
        trains.append(_tagged(train_set, source.name))
        vals.append(_tagged(val_set, source.name))
    val_set = _joined([v for v in vals if v is not None])
    if not training:
        return RunData(None, *_validation(data, val_set, tokenizer), dirs)
    train_set = _joined(trains)
    sampler = StratifiedSampler([sample.source for sample in train_set.samples], data.train_batch_size, seed=data.seed,
                                shares={source.name: source.share for source in sources})
    return RunData(_training_loader(data, train_set, tokenizer, sampler), *_validation(data, val_set, tokenizer), dirs)


def _tagged(dataset: RLDataset | None, name: str) -> RLDataset | None:
    return None if dataset is None else dataset.with_samples([replace(sample, source=name) for sample in dataset.samples])


def _joined(datasets: Sequence[RLDataset]) -> RLDataset | None:
    """The datasets' rows one after another (None for none)."""
    if not datasets:
        return None
    return datasets[0].with_samples([sample for dataset in datasets for sample in dataset.samples],
                                    sum(dataset.num_filtered for dataset in datasets))


def build_sampler(data: DataConfig, rows: Sequence[Any]) -> StratifiedSampler | None:
    """``data.sampler``'s strata and curriculum over the training rows; None when it sets neither
    (the loader's plain shuffled epochs)."""
    options = data.sampler
    curriculum = options.curriculum
    if options.stratify_by is None and curriculum.key is None:
        return None
    strata = [row_value(row, options.stratify_by) if options.stratify_by else "all" for row in rows]
    levels = [row_value(row, curriculum.key) for row in rows] if curriculum.key else None
    return StratifiedSampler(strata, data.train_batch_size, seed=data.seed, shares=options.shares, levels=levels,
                             level_order=curriculum.levels, curriculum=Curriculum(curriculum.threshold, curriculum.window) if levels else None)


class CurriculumTracker:
    """The samples a step generated (every round of dynamic sampling, before its filter drops the groups
    that all failed or all passed), their accuracy told to the sampler's curriculum once the step is done."""

    def __init__(self, sampler: StratifiedSampler) -> None:
        self.sampler, self.rows, self.accuracy = sampler, [], []

    def add(self, batch: Batch) -> None:
        if keys.GUIDED in batch:  # a reference answer (rollout/guidance.py) says nothing of the policy's accuracy
            batch = batch.index(~batch[keys.GUIDED])
        self.rows += [row_of_uid(uid) for uid in batch[keys.UID]]
        self.accuracy += sample_accuracy(batch).tolist()

    def step_done(self) -> dict[str, float]:
        """``curriculum/level`` (as it was for this step) and ``curriculum/accuracy``; the level may step up after."""
        metrics = self.sampler.observe(self.rows, self.accuracy)
        self.rows, self.accuracy = [], []
        return metrics


def curriculum_tracker(loader: PromptDataLoader | None) -> CurriculumTracker | None:
    """A tracker when the training loader's sampler has a curriculum, else None."""
    sampler = getattr(loader, "sampler", None)
    return CurriculumTracker(sampler) if getattr(sampler, "curriculum", None) is not None else None


def _validation(data: DataConfig, val_set: RLDataset | None, tokenizer: Any) -> tuple[PromptDataLoader | None, RLDataset | None]:
    """The validation loader and its dataset; (None, None) without one. Its batches are ``data.val_batch_size``
    prompts, or (null) at most :data:`VALIDATION_CHUNK`, so a long validation says how far it is after each."""
    if val_set is None:
        return None, None
    size = data.val_batch_size or min(len(val_set), VALIDATION_CHUNK)
    return PromptDataLoader(val_set, size, tokenizer.pad_token_id, shuffle=False, drop_last=False), val_set
