"""Rewards: score functions for rule-checkable answers, and the managers that apply them to a Batch.

Score functions are plain callables, usable without a trainer:
``score(solution_str, ground_truth, **options) -> float | dict`` (a dict has ``"score"`` and extras
such as ``"acc"`` and ``"format"``):

- :func:`posttrain.rewards.gsm8k.compute_score` — GSM8K, ``####`` answer (strict) or last number;
- :func:`posttrain.rewards.arithmetic.compute_score` — integer after ``####``, exact match;
- :func:`posttrain.rewards.math_answer.compute_score` — LaTeX answers through math-verify.

:mod:`posttrain.rewards.registry` maps a sample's ``data_source`` to its function;
:mod:`posttrain.rewards.custom` loads a user's function from a .py file;
:mod:`posttrain.rewards.manager` decodes responses and places scores on the last response token;
:mod:`posttrain.deadlines` runs score functions with a per-sample deadline in a child process.

A run builds its manager from ``custom_reward_function``'s fields (never the config object)::

    manager = build_reward_manager(tokenizer, custom_path=cfg.path, custom_name=cfg.name,
                                   reward_kwargs=cfg.reward_kwargs, timeout_s=cfg.timeout_s)
    result = manager(batch)   # RewardResult: token_scores (B, T), scores, extra, metrics

This package root imports no torch: the scoring child process imports it, and should start fast.
The managers (which need torch) are therefore imported on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import Any

from posttrain.rewards.custom import CustomRewardError, FileScoreFunction, load_function
from posttrain.rewards.registry import (
    DEFAULT_SCORE_FUNCTIONS,
    ScoreFunction,
    UnknownDataSourceError,
    score_function_for,
)
from posttrain.deadlines import CallOutcome, InlineScorer, ProcessScorer

_MANAGER_NAMES = ("BatchRewardManager", "RewardManager", "RewardResult", "build_reward_manager", "decode_responses", "place_scores")


def __getattr__(name: str) -> Any:
    if name in _MANAGER_NAMES:
        return getattr(importlib.import_module("posttrain.rewards.manager"), name)
    raise AttributeError(f"module 'posttrain.rewards' has no attribute {name!r}")


__all__ = [
    "DEFAULT_SCORE_FUNCTIONS",
    "CallOutcome",
    "CustomRewardError",
    "FileScoreFunction",
    "InlineScorer",
    "ProcessScorer",
    "ScoreFunction",
    "UnknownDataSourceError",
    "load_function",
    "score_function_for",
    *_MANAGER_NAMES,
]
