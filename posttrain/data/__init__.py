"""Prompt datasets for RL: verl-format Parquet in, :class:`~posttrain.protocol.Batch` of prompts out.

- :mod:`posttrain.data.format` — the row format, reading and writing it (pyarrow);
- :class:`RLDataset` — chat template, tokenising, overlong-prompt filtering or truncation;
- :class:`PromptDataLoader` — seeded shuffling, batches, a resumable position (``state_dict``);
- :func:`prepare` — the preparers behind ``posttrain prepare NAME --out DIR`` (gsm8k, arithmetic, synthetic-search).

Building loaders from the config (``DataConfig``) is the trainer's job::

    train = RLDataset(cfg.train_files, tokenizer, prompt_key=cfg.prompt_key,
                      max_prompt_length=cfg.max_prompt_length, truncation=cfg.truncation,
                      filter_overlong_prompts=cfg.filter_overlong_prompts)
    loader = PromptDataLoader(train, cfg.train_batch_size, tokenizer.pad_token_id,
                              shuffle=cfg.shuffle, seed=cfg.seed)
    val_loader = PromptDataLoader(val, cfg.val_batch_size or min(len(val), 256), tokenizer.pad_token_id,
                                  shuffle=False, drop_last=False)
"""

from posttrain.data.dataset import PromptSample, PromptTooLongError, RLDataset, TRUNCATION_MODES, split_dev, tokenize_prompts
from posttrain.data.format import (
    CHAT_ROLES, DataFormatError, PromptRow, RowProblem, make_row, problems_report, read_rows, write_conversations, write_rows,
)
from posttrain.data.loader import EpochSampler, PromptDataLoader, collate_prompts
from posttrain.data.preparers import PREPARERS, describe_options, parse_options, prepare, preparer_names

__all__ = [
    "CHAT_ROLES",
    "PREPARERS",
    "TRUNCATION_MODES",
    "DataFormatError",
    "EpochSampler",
    "PromptDataLoader",
    "PromptRow",
    "PromptSample",
    "PromptTooLongError",
    "RLDataset",
    "RowProblem",
    "collate_prompts",
    "describe_options",
    "make_row",
    "parse_options",
    "prepare",
    "preparer_names",
    "problems_report",
    "read_rows",
    "split_dev",
    "tokenize_prompts",
    "write_conversations",
    "write_rows",
]
