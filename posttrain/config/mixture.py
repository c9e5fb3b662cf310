"""Mixtures: several datasets in one run, each with its own environment, score functions and weight.

    mixture:
      - {name: arithmetic, weight: 2, data: {builtin: arithmetic, max_response_length: 48}}
      - {name: rg, weight: 1, data: {builtin: reasoning-gym, builtin_options: {...}}}
      - {name: guess, weight: 1, data: {builtin: textarena, ...}, env: {name: textarena, options: {...}}}

A source is the run's config with its own ``data``, ``env``, ``reward`` and ``custom_reward_function``
sections merged over the run's (:func:`mixture_sources`): what the run sets for every source (the model,
the algorithm, ``env.max_turn_tokens``, the Env-LLM) is set once at the top; a source sets only what is
its own. Each training batch holds the sources' rows in proportion to their weights, allocated by
largest remainder (``data/sampler.py``: a stratum per source, its weight its share); validation
reports each source as ``val/<name>/...``.

What stays the run's: the batch (``data.train_batch_size``, ``val_batch_size``, ``seed``, ``shuffle``,
``sampler``), and the one Env-LLM (``env.llm``, which a judge and every environment share). A source's
``data.max_response_length`` is its own generation budget (single-turn rows), at most the run's, which
is every batch's width; its ``data.max_prompt_length`` is at most the run's, which sizes the engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posttrain.config.schema import PosttrainConfig
from posttrain.errors import InputError, Problem

SECTIONS = ("data", "env", "reward", "custom_reward_function")  # what a source may set of its own
# the run's, for every source: the batch, the one Env-LLM, and the limits the circuit breakers read (over all sources' counts)
RUN_WIDE = {
    "data": ("train_batch_size", "val_batch_size", "seed", "shuffle", "sampler"),
    "env": ("llm", "retriever.stop_at_failed_fraction"),
    "reward": ("judge.stop_at_failed_fraction",),
    "custom_reward_function": ("stop_at_failed_fraction",),
}
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # a metric path segment: val/<name>/acc/...


@dataclass(frozen=True)
class MixtureSource:
    """One source of a mixture: its ``name`` (metrics, batches), ``share`` of every batch (its weight over
    the weights' sum), ``config`` (the run's with the source's sections over it; ``data.max_response_length``
    the run's, every batch's width) and ``max_new_tokens`` (a single-turn response's budget)."""

    name: str
    share: float
    config: PosttrainConfig
    max_new_tokens: int


def mixture_sources(config: PosttrainConfig) -> list[MixtureSource]:
    """``config.mixture``'s sources, or ``[]`` without one; a mixture that cannot work raises InputError
    with every problem (:func:`mixture_problems`)."""
    problems = mixture_problems(config)
    if problems:
        raise InputError("; ".join(str(problem) for problem in problems))
    if not config.mixture:
        return []
    total = sum(float(entry["weight"]) for entry in config.mixture)
    return [_source(config, dict(entry), float(entry["weight"]) / total) for entry in config.mixture]


def mixture_problems(config: PosttrainConfig) -> list[Problem]:
    """Every reason ``config.mixture`` cannot work: an entry's shape, names, weights, the sections it may set,
    a run-wide setting a source sets, a dataset set at the top beside the mixture, a budget above the run's."""
    entries = list(config.mixture)
    if not entries:
        return []
    problems, names = [], []
    if len(entries) < 2:
        problems.append(Problem("mixture", entries, "a mixture has at least two sources; for one, set data and env at the top"))
    top = config.data
    if top.train_files or top.val_files or top.builtin or top.builtin_options or top.dev_size:
        problems.append(Problem("data", "train_files/val_files/builtin/builtin_options/dev_size", "with a mixture each source names its own data "
                                "(mixture[i].data); leave them unset at the top (`posttrain train` starts from the preset "
                                "arithmetic_grpo, which sets them: give --preset mixture_grpo, or --preset '' with your file)"))
    if config.env.name is not None:
        problems.append(Problem("env.name", config.env.name, "with a mixture each source names its environment (mixture[i].env.name); "
                                "leave env.name unset at the top (what the top's env sets is every source's default)"))
    if top.sampler.stratify_by is not None or top.sampler.curriculum.key is not None:
        problems.append(Problem("data.sampler", "stratify_by/curriculum", "a mixture's batches are strata by source, by weight; "
                                "strata within a source and a curriculum are not combined with a mixture (yet)"))
    for index, entry in enumerate(entries):
        key = f"mixture[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(Problem(key, entry, "a source is a mapping {name, weight, data, env, reward, custom_reward_function}"))
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            problems.append(Problem(f"{key}.name", name, "a name of letters, digits, '_', '.', '-' (it names the source's metrics)"))
        elif name in names:
            problems.append(Problem(f"{key}.name", name, "two sources have this name; each needs its own"))
        names.append(name)
        weight = entry.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            problems.append(Problem(f"{key}.weight", weight, "a positive number: the source's share of every batch is its weight "
                                    "over the weights' sum"))
        problems += _section_problems(key, entry, config)
    return problems


def _section_problems(key: str, entry: Mapping[str, Any], config: PosttrainConfig) -> list[Problem]:
    problems = []
    unknown = sorted(set(entry) - {"name", "weight", *SECTIONS})
    if unknown:
        problems.append(Problem(key, unknown, f"a source sets only name, weight and its own {', '.join(SECTIONS)}; the rest "
                                "(the model, the algorithm, the trainer) is the run's"))
    for section in SECTIONS:
        value = entry.get(section, {})
        if not isinstance(value, Mapping):
            problems.append(Problem(f"{key}.{section}", value, "a mapping of that section's keys"))
            continue
        for field in RUN_WIDE.get(section, ()):
            head, _, rest = field.partition(".")
            inner = value.get(head)
            if head in value and (not rest or (isinstance(inner, Mapping) and rest in inner)):
                problems.append(Problem(f"{key}.{section}.{field}", inner[rest] if rest else inner,
                                        f"the run's, for every source: set {section}.{field} at the top"))
    if problems:
        return problems
    try:
        merged = _merged(config, dict(entry))
    except (OmegaConfBaseException, ValueError) as error:
        return [Problem(key, {s: entry.get(s) for s in SECTIONS if s in entry}, f"does not fit the config's sections: {error}")]
    data = merged.data
    if not (data.train_files or data.builtin or data.val_files):
        problems.append(Problem(f"{key}.data", dict(entry.get("data", {})), "names no rows: set builtin (with builtin_options) "
                                "or train_files and val_files"))
    for field in ("max_prompt_length", "max_response_length"):
        own, run = getattr(data, field), getattr(config.data, field)
        if own > run:
            problems.append(Problem(f"{key}.data.{field}", own, f"at most the run's data.{field}={run}, which sizes the engine and "
                                    "every batch; raise the run's"))
    if data.max_response_length < config.data.max_response_length and config.reward_model.overlong_buffer.enable:
        problems.append(Problem(f"{key}.data.max_response_length", data.max_response_length, "reward_model.overlong_buffer measures "
                                "every response against the run's data.max_response_length: give this source the run's budget, or "
                                "turn the buffer off"))
    if merged.env.filter_groups_quantile > 0:
        problems.append(Problem(f"{key}.env.filter_groups_quantile", merged.env.filter_groups_quantile, "a source's groups are not "
                                "dropped by their spread in a mixture (the batch would no longer split into its mini-batches); use "
                                "algorithm.filter_groups (dynamic sampling), which fills the batch again"))
    return problems


def _merged(config: PosttrainConfig, entry: dict[str, Any]) -> PosttrainConfig:
    own = {section: OmegaConf.to_container(OmegaConf.create(entry[section])) for section in SECTIONS if section in entry}
    merged = OmegaConf.merge(OmegaConf.structured(config), own)
    merged.mixture = []
    return OmegaConf.to_object(merged)


def _source(config: PosttrainConfig, entry: dict[str, Any], share: float) -> MixtureSource:
    merged = _merged(config, entry)
    budget = merged.data.max_response_length
    merged.data.max_response_length = config.data.max_response_length
    return MixtureSource(entry["name"], share, merged, budget)
