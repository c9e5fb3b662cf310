"""Checks on a whole config, run once before any worker starts. Each returns problems, never raises,
so that a user sees every mistake in one go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.config.algorithm_checks import (
    check_dynamic_sampling,
    check_guidance,
    check_kl_first,
    check_kl_groups,
    check_loss_scale_factor,
    check_overlong_buffer,
    check_reward_norm,
    check_skip_first,
    critic_enabled,
    needs_greedy_baseline,
)
from posttrain.config.schema import PosttrainConfig
from posttrain.errors import Problem

ENGINE_DTYPES = ("auto", "bfloat16", "float32")  # a rollout engine's weights (auto: bf16 where native)
CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right"),
    "actor_rollout_ref.rollout.name": ("vllm", "hf"),
    "actor_rollout_ref.rollout.dtype": ENGINE_DTYPES,
    "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "actor_rollout_ref.actor.attn_implementation": ("auto", "eager", "sdpa"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "reward_model.reward_manager": ("naive", "batch"),
    "env.observation_role": ("user", "tool"),
    "env.reward_norm": ("none", "group", "batch"),
    "env.retriever.index": ("bm25", "dense"),
    "env.llm.rollout": ("vllm", "hf"),
    "env.llm.dtype": ENGINE_DTYPES,
    "env.llm.placement": ("colocate", "separate"),
    "sft.truncation": ("error", "drop", "left"),
    "trainer.mode": ("sync", "async"),
    "async_.partial_rollout": ("finish", "resume"),
    "async_.correction": ("decoupled", "none"),
    "async_.weight_transport": ("auto", "object_store", "collective"),
}

POSITIVE: tuple[str, ...] = (
    "data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.n", "critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size_per_gpu",
    "critic.ppo_epochs", "trainer.nnodes", "trainer.n_workers_per_node", "trainer.total_epochs",
    "sft.max_length", "sft.train_batch_size", "sft.micro_batch_size_per_gpu", "sft.total_epochs",
)


def get(config: object, key: str) -> object:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def validate_config(config: PosttrainConfig, command: str = "train") -> list[Problem]:
    """The config's own rules for ``command`` (train, eval, sft): choices, ranges, batch arithmetic,
    settings that cannot work together. The rules that ask the pieces a run builds — engine settings,
    registries, files — are ``cli/preflight.py``'s; its ``check_config`` runs both sets."""
    problems = _check_choices(config) + _check_positive(config) + check_ranges(config)
    if command == "train" and not any(p.key in POSITIVE for p in problems):  # SFT and evaluation make no RL batch
        problems += check_batch_arithmetic(config)
    if config.env.name is not None:
        problems += check_env(config)
    if command == "train":
        problems += MODE_RULES.get(config.trainer.mode, _no_rules)(config)  # an unknown mode is _check_choices' problem
    problems += check_loss_scale_factor(config) + check_call_timeout(config) + check_overlong_buffer(config) + check_reward_norm(config)
    problems += check_dynamic_sampling(config) + check_kl_groups(config) + check_guidance(config)
    if config.data.dev_files and config.data.dev_size == 0:
        problems.append(Problem("data.dev_files", list(config.data.dev_files), "are validated on beside data.dev_size's development rows: set "
                                "data.dev_size, or give the files as data.val_files"))
    if command == "train":
        problems += check_sampler(config) + check_skip_first(config) + check_kl_first(config)
    problems += check_breakers(config) + check_retriever_token_env(config)
    if command == "sft":
        problems += check_sft(config)
    return problems


def check_retriever_token_env(config: PosttrainConfig) -> list[Problem]:
    """env.retriever.token_env names a variable; a value that cannot be one is likely the token itself."""
    name = config.env.retriever.token_env
    if name is None or (name.isascii() and name.replace("_", "a").isalnum() and not name[0].isdigit()):
        return []
    return [Problem("env.retriever.token_env", "(hidden: it may be the token)",
                    "must name the environment variable that holds the retriever's token (e.g. POSTTRAIN_RETRIEVER_TOKEN), "
                    "not the token itself; export the token in that variable, or null to send none")]


def check_breakers(config: PosttrainConfig) -> list[Problem]:
    """The circuit breakers' limits (``trainer/breakers.py``) and the reward's time budget per step."""
    problems = []
    for key in ("custom_reward_function.stop_at_failed_fraction", "env.retriever.stop_at_failed_fraction", "env.llm.stop_at_failed_fraction",
                "reward.judge.stop_at_failed_fraction"):
        fraction = get(config, key)
        if fraction is not None and not 0 < fraction <= 1:
            problems.append(Problem(key, fraction, "must be in (0, 1] (1.0: stop when every call of a step fails), or null never to stop"))
    budget = config.custom_reward_function.step_timeout_s
    if budget is not None and not budget > 0:
        problems.append(Problem("custom_reward_function.step_timeout_s", budget, "must be > 0 seconds, or null for no limit"))
    if config.trainer.stop_after_skipped_steps < 0:
        problems.append(Problem("trainer.stop_after_skipped_steps", config.trainer.stop_after_skipped_steps,
                                "must be >= 0 (0: never stop for skipped updates)"))
    return problems


def check_sampler(config: PosttrainConfig) -> list[Problem]:
    """``data.sampler``'s rules that need no data (the rows' own are checked as the sampler is built:
    data/sampler.py): columns it can read, shares that are fractions, a curriculum that can step up."""
    sampler, problems = config.data.sampler, []
    curriculum = sampler.curriculum
    for key, column in (("data.sampler.stratify_by", sampler.stratify_by), ("data.sampler.curriculum.key", curriculum.key)):
        if column is not None and column != "data_source" and not (column.startswith("extra_info.") and len(column) > len("extra_info.")):
            problems.append(Problem(key, column, "must name a column of the rows: data_source or extra_info.<field>"))
    if sampler.shares and sampler.stratify_by is None:
        problems.append(Problem("data.sampler.shares", dict(sampler.shares), "shares are of strata: set data.sampler.stratify_by"))
    bad = {name: share for name, share in sampler.shares.items() if not 0 < share <= 1}
    if bad:
        problems.append(Problem("data.sampler.shares", bad, "each share is a fraction of a batch in (0, 1]"))
    elif sum(sampler.shares.values()) > 1 + 1e-9:
        problems.append(Problem("data.sampler.shares", dict(sampler.shares), f"sum to {sum(sampler.shares.values()):.3g}: at most 1"))
    if curriculum.key is not None:
        if not 0 < curriculum.threshold <= 1:
            problems.append(Problem("data.sampler.curriculum.threshold", curriculum.threshold,
                                    "an accuracy in (0, 1]: above 1 the level never steps up"))
        if curriculum.window < 1:  # longer than this run is allowed: a run resumed with more steps goes on
            problems.append(Problem("data.sampler.curriculum.window", curriculum.window,
                                    "the steps averaged before the level may step up: at least 1"))
    if (sampler.stratify_by is not None or curriculum.key is not None) and not config.data.shuffle:
        problems.append(Problem("data.shuffle", False, "data.sampler draws shuffled orders of its own; set data.shuffle=true, or no data.sampler"))
    return problems


def check_call_timeout(config: PosttrainConfig) -> list[Problem]:
    timeout = config.trainer.call_timeout_s
    if timeout is not None and not timeout > 0:
        return [Problem("trainer.call_timeout_s", timeout,
                        "must be > 0 seconds (how long a worker call may take before the run stops), or null for no deadline")]
    return []


def check_async(config: PosttrainConfig) -> list[Problem]:
    """What asynchronous training cannot run with (``MODE_RULES``: checked only for ``trainer.mode=async``)."""
    options, batch = config.async_, config.data.train_batch_size
    problems = []
    if options.buffer_size is not None and 1 <= options.buffer_size < batch:
        problems.append(Problem("async.buffer_size", options.buffer_size,
                                f"must hold at least one batch (data.train_batch_size={batch} groups), or null for (max_staleness + 1) batches"))
    if config.algorithm.guidance.enable:
        problems.append(Problem("algorithm.guidance.enable", True,
                                "a reference answer has no logprobs from the engine that sampled its batch, which asynchronous "
                                "training weights samples by (async.correction=decoupled), and guidance is built for sync mode "
                                "only; use trainer.mode=sync"))
    unit = options.unit_groups
    if unit is not None and unit >= 1 and batch % unit:
        problems.append(Problem("async.unit_groups", unit,
                                f"must divide data.train_batch_size={batch} (a batch is a whole number of generator calls), or null"))
    if needs_greedy_baseline(config):
        problems.append(Problem("algorithm.adv_estimator", config.algorithm.adv_estimator,
                                "it needs a greedy baseline rollout with the very weights being trained, which "
                                "asynchronous generators do not have; use grpo/rloo, or trainer.mode=sync",
                                source="trainer.mode=async"))
    if config.reward_model.enable:
        problems.append(Problem("reward_model.enable", True, "the reward-model worker is not reachable from the generators yet; "
                                "use rule rewards or trainer.mode=sync", source="trainer.mode=async"))
    return problems


def _no_rules(config: PosttrainConfig) -> list[Problem]:
    return []


# Each trainer.mode's own config rules, by the mode's name. trainer/modes.py picks the mode's parts, but
# the config is checked below that layer, when it is loaded: this table is the config's one view of the modes.
MODE_RULES: dict[str, Callable[[PosttrainConfig], list[Problem]]] = {"sync": _no_rules, "async": check_async}


def check_sft(config: PosttrainConfig) -> list[Problem]:
    """The SFT section's batch arithmetic (checked for ``posttrain sft`` only, and by ``posttrain config``
    for an SFT config, so that an RL run's layout never trips over SFT defaults): transcripts per step
    split over ranks, then micro-batches."""
    sft, ranks = config.sft, config.trainer.nnodes * config.trainer.n_workers_per_node
    problems = []
    if min(sft.train_batch_size, sft.micro_batch_size_per_gpu, ranks) < 1:
        return problems  # the rest is reported by _check_positive
    if sft.train_batch_size % ranks:
        problems.append(Problem("sft.train_batch_size", sft.train_batch_size,
                                f"must be a multiple of the {ranks} rank(s) (trainer.nnodes × trainer.n_workers_per_node)"))
        return problems
    per_rank = sft.train_batch_size // ranks
    if per_rank % sft.micro_batch_size_per_gpu:
        problems.append(Problem("sft.micro_batch_size_per_gpu", sft.micro_batch_size_per_gpu,
                                f"must divide the {per_rank} transcripts each rank gets per step; e.g. set it to "
                                f"{_largest_divisor_at_most(per_rank, sft.micro_batch_size_per_gpu)}"))
    return problems


def check_env(config: PosttrainConfig) -> list[Problem]:
    """Settings of the multi-turn agent loop that cannot work together."""
    env, problems = config.env, []
    for key in ("max_turn_tokens", "max_obs_length"):
        if getattr(env, key) < 1:
            problems.append(Problem(f"env.{key}", getattr(env, key), "must be >= 1"))
    if env.max_turns < -1:
        problems.append(Problem("env.max_turns", env.max_turns, "must be >= 0 (0: answer at once, no tool turns), "
                                "or -1 (each episode's budget drawn from 2 to 10, DoctorAgent-RL's dynamic turns)"))
    if env.turns_range and (len(env.turns_range) != 2 or not 0 <= env.turns_range[0] <= env.turns_range[1]):
        problems.append(Problem("env.turns_range", env.turns_range, "must be [low, high] with 0 <= low <= high, or [] for env.max_turns"))
    if not 0.0 <= env.filter_groups_quantile < 1.0:
        problems.append(Problem("env.filter_groups_quantile", env.filter_groups_quantile, "must be in [0, 1); 0 keeps every group"))
    if env.max_turn_tokens > config.data.max_response_length:
        problems.append(Problem(
            "env.max_turn_tokens", env.max_turn_tokens,
            f"must be <= data.max_response_length={config.data.max_response_length} (which holds all turns and observations)",
        ))
    if config.reward_model.enable:
        problems.append(Problem("reward_model.enable", True, "multi-turn environments give the rewards; set reward_model.enable=false"))
    return problems + _check_env_llm(config) + _check_tool_settings(config)


def _check_tool_settings(config: PosttrainConfig) -> list[Problem]:
    """The tool environment's numbers; whether each tool loads, and whether the environment takes
    tools at all, are the preflight's checks (it asks the environment's class)."""
    env, problems = config.env, []
    if env.tool_timeout_s <= 0:
        problems.append(Problem("env.tool_timeout_s", env.tool_timeout_s, "must be > 0 seconds"))
    if env.max_tool_calls < 0:
        problems.append(Problem("env.max_tool_calls", env.max_tool_calls, "must be >= 0 (0: every call is refused as over budget)"))
    if env.tool_output_chars < 1:
        problems.append(Problem("env.tool_output_chars", env.tool_output_chars, "must be >= 1"))
    return problems


def _check_env_llm(config: PosttrainConfig) -> list[Problem]:
    """The environment LLM's numbers (its sampling settings are the rollout engine's rules: preflight)."""
    llm = config.env.llm
    rules = (
        ("max_tokens", llm.max_tokens >= 1, "must be >= 1"),
        ("cpus", llm.cpus >= 1, "must be >= 1"),
        ("max_model_len", llm.max_model_len > llm.max_tokens, f"must exceed env.llm.max_tokens={llm.max_tokens}: it holds the prompt and the reply"),
        ("retries", llm.retries >= 0, "must be >= 0"),
        ("timeout_s", llm.timeout_s > 0, "must be > 0 seconds"),
    )
    return [Problem(f"env.llm.{key}", getattr(llm, key), fix) for key, holds, fix in rules if not holds]


def _check_choices(config: PosttrainConfig) -> list[Problem]:
    return [
        Problem(key.replace("async_.", "async."), get(config, key), f"must be one of {', '.join(allowed)}")
        for key, allowed in CHOICES.items()
        if get(config, key) not in allowed
    ]


def _check_positive(config: PosttrainConfig) -> list[Problem]:
    problems = [Problem(key, get(config, key), "must be >= 1") for key in POSITIVE if get(config, key) < 1]
    if config.trainer.critic_warmup < 0:
        problems.append(Problem("trainer.critic_warmup", config.trainer.critic_warmup, "must be >= 0"))
    return problems


def check_batch_arithmetic(config: PosttrainConfig) -> list[Problem]:
    """The divisibility a PPO/GRPO step needs, with the numbers that disagree in each message."""
    data, actor, rollout = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    ranks = config.trainer.nnodes * config.trainer.n_workers_per_node
    problems: list[Problem] = []
    sections = [("actor_rollout_ref.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz)]
    if critic_enabled(config):
        sections.append(("critic", config.critic.ppo_mini_batch_size, config.critic.ppo_micro_batch_size_per_gpu, False))
    for section, mini, micro, dynamic in sections:
        if data.train_batch_size % mini:
            problems.append(Problem(
                f"{section}.ppo_mini_batch_size", mini,
                f"must divide data.train_batch_size={data.train_batch_size} (both count prompts); "
                f"e.g. set it to {_largest_divisor_at_most(data.train_batch_size, mini)}",
            ))
            continue
        samples = mini * rollout.n
        if samples % ranks:
            problems.append(Problem(
                f"{section}.ppo_mini_batch_size", mini,
                f"{mini} prompts × rollout.n={rollout.n} = {samples} samples per mini-batch do not split over "
                f"{ranks} rank(s) (trainer.nnodes × trainer.n_workers_per_node); make it a multiple of {ranks}",
            ))
            continue
        per_rank = samples // ranks
        if not dynamic and per_rank % micro:
            problems.append(Problem(
                f"{section}.ppo_micro_batch_size_per_gpu", micro,
                f"must divide the {per_rank} samples each rank gets per mini-batch ({mini} prompts × n={rollout.n} / "
                f"{ranks} ranks); e.g. set it to {_largest_divisor_at_most(per_rank, micro)}",
            ))
    return problems


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("algorithm.gamma", lambda v: 0 <= v <= 1, "must be in [0, 1] (the discount; 1 for outcome rewards)"),
    ("algorithm.lam", lambda v: 0 <= v <= 1, "must be in [0, 1] (GAE's lambda; 1 for Monte Carlo returns)"),
    ("actor_rollout_ref.actor.clip_ratio_low", lambda v: v >= 0, "must be >= 0 (the ratio is clipped below at 1 - clip_ratio_low; 0.2 is usual)"),
    ("actor_rollout_ref.actor.clip_ratio_high", lambda v: v >= 0, "must be >= 0 (the ratio is clipped above at 1 + clip_ratio_high; 0.2-0.28 is usual)"),
    ("actor_rollout_ref.actor.clip_ratio_c", lambda v: v > 1, "must be > 1 (dual-clip's bound for negative advantages; 3 is usual)"),
    ("critic.cliprange_value", lambda v: v >= 0, "must be >= 0 (how far a value may move from the old one)"),
    ("actor_rollout_ref.actor.kl_loss_coef", lambda v: v >= 0, "must be >= 0"),
    ("actor_rollout_ref.actor.policy_loss_skip_first", lambda v: v >= 0, "must be >= 0"),
    ("actor_rollout_ref.actor.kl_loss_first_tokens", lambda v: v >= 0, "must be >= 0 (0: every response token)"),
    ("actor_rollout_ref.actor.kl_loss_first_token_weight", lambda v: v >= 0, "must be >= 0 (1: the first token as any other)"),
    ("algorithm.kl_ctrl.kl_coef", lambda v: v >= 0, "must be >= 0"),
    ("algorithm.kl_ctrl.target_kl", lambda v: v > 0, "must be > 0"),
    ("algorithm.kl_ctrl.horizon", lambda v: v >= 1, "must be >= 1"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", lambda v: 0 < v <= 1, "must be in (0, 1]: the share of GPU memory vLLM may take"),
    ("actor_rollout_ref.rollout.cpu_kv_cache_gb", lambda v: v > 0, "must be > 0 (GiB for vLLM's KV cache on CPU)"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", lambda v: v >= 1, "must be >= 1"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", lambda v: v >= 1, "must be >= 1"),
    ("actor_rollout_ref.rollout.val_kwargs.n", lambda v: v >= 1, "must be >= 1"),
    ("custom_reward_function.timeout_s", lambda v: v > 0, "must be > 0 (seconds one score call may take; past it the sample scores 0)"),
    ("data.val_batch_size", lambda v: v is None or v >= 1, "must be >= 1, or null (at most 256 prompts a batch)"),
    ("trainer.total_training_steps", lambda v: v is None or v >= 1, "must be >= 1, or null for trainer.total_epochs"),
    ("trainer.max_ckpt_to_keep", lambda v: v is None or v >= 1, "must be >= 1, or null to keep every checkpoint"),
    ("trainer.test_freq", lambda v: v == -1 or v >= 1, "must be -1 (validate before and after training only) or >= 1 (every N steps)"),
    ("trainer.save_freq", lambda v: v == -1 or v >= 1, "must be -1 (save at the end only) or >= 1 (every N steps)"),
    ("trainer.val_samples_in_report", lambda v: v >= 0, "must be >= 0"),
    ("trainer.cpus_per_worker", lambda v: v is None or v >= 1, "must be >= 1, or null for this machine's CPUs split evenly over its workers"),
    ("env.retriever.timeout_s", lambda v: v > 0, "must be > 0 seconds (per search request)"),
    ("env.retriever.retries", lambda v: v >= 0, "must be >= 0"),
    ("env.retriever.startup_timeout_s", lambda v: v > 0, "must be > 0 seconds (how long a started retriever may take to serve)"),
    ("env.retriever.port", lambda v: v is None or 1 <= v <= 65535, "must be a TCP port in [1, 65535], or null for any free port"),
    ("env.retriever.url", lambda v: v is None or _has_scheme(v), "must start with http:// or https:// (e.g. http://localhost:8000), or null to start one for the run"),
    ("env.llm.url", lambda v: v is None or _has_scheme(v), "must start with http:// or https:// (e.g. http://localhost:8000/v1), or null for the in-cluster worker"),
    ("env.llm.cpu_kv_cache_gb", lambda v: v > 0, "must be > 0 (GiB for the Env-LLM's vLLM KV cache on CPU)"),
    ("env.llm.gpu_memory_utilization", lambda v: 0 < v <= 1, "must be in (0, 1]: the share of GPU memory the Env-LLM's vLLM may take"),
    ("env.llm.min_faithfulness", lambda v: v is None or 0 <= v <= 1, "must be in [0, 1] (the share of yes/no findings the patient must get right), or null for no probe"),
    ("reward.judge.min_agreement", lambda v: v is None or 0 <= v <= 1, "must be in [0, 1] (the share of the rule's verdicts the judge must give), or null for no check"),
    ("reward.judge.agreement_rows", lambda v: v >= 1, "must be >= 1 (rows of the judge's check before training)"),
    ("reward.judge.timeout_s", lambda v: v is None or v > 0, "must be > 0 seconds (one batched judge request), or null for no deadline"),
    ("env.llm.gpus", lambda v: v >= 0, "must be >= 0 (GPUs of the Env-LLM's own pool on a GPU machine)"),
    ("actor_rollout_ref.rollout.top_k", lambda v: v >= -1, "must be -1 or 0 (no top-k cut) or >= 1 (sample among the k likeliest tokens)"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", lambda v: v >= -1, "must be -1 or 0 (no top-k cut) or >= 1 (sample among the k likeliest tokens)"),
    ("async_.num_generators", lambda v: v >= 1, "must be >= 1"),
    ("async_.max_staleness", lambda v: v >= 0, "must be >= 0 (0: synchronous behaviour, 1: one-step off-policy, k: up to k versions behind)"),
    ("async_.generator_cpus", lambda v: v > 0, "must be > 0"),
    ("async_.generator_gpus", lambda v: v >= 0, "must be >= 0 (GPUs of each generator on a GPU machine)"),
    ("async_.importance_cap", lambda v: v > 0, "must be > 0"),
    ("async_.buffer_size", lambda v: v is None or v >= 1, "must be >= 1 (groups), or null for (max_staleness + 1) batches"),
    ("async_.unit_groups", lambda v: v is None or v >= 1, "must be >= 1 (groups per generator call), or null"),
    ("sft.total_training_steps", lambda v: v is None or v >= 1, "must be >= 1, or null for sft.total_epochs"),
    ("sft.grad_clip", lambda v: v is None or v > 0, "must be > 0 (the gradient norm's clip), or null to measure it without clipping"),
    ("sft.test_freq", lambda v: v == -1 or v >= 1, "must be -1 (validate at the start and end only) or >= 1 (every N steps)"),
    ("sft.seed", lambda v: v >= 0, "must be >= 0"),
    ("trainer.seed", lambda v: v >= 0, "must be >= 0"),
    ("data.dev_size", lambda v: v >= 0, "must be >= 0 (0: validate on data.val_files)"),
    ("algorithm.filter_groups.max_num_gen_batches", lambda v: v >= 1, "must be >= 1 (generation rounds per step at most)"),
    ("algorithm.filter_groups.kl_groups", lambda v: v >= 0, "must be >= 0 (0: keep none of the dropped groups)"),
    ("reward_model.overlong_buffer.penalty_factor", lambda v: v >= 0, "must be >= 0 (the reward lost at the response limit)"),
    ("trainer.max_restarts", lambda v: v is None or v >= 0, "must be >= 0 (0: stop at the first dead or hung worker), or null for 2 with trainer.save_freq >= 1"),
)


def _has_scheme(url: str) -> bool:
    return url.startswith(("http://", "https://")) and len(url.split("://", 1)[1]) > 0


def check_ranges(config: PosttrainConfig) -> list[Problem]:
    """Numbers that must lie in a range: discounts, clip ratios, coefficients, timeouts, frequencies."""
    return [Problem(key.replace("async_.", "async."), get(config, key), fix) for key, holds, fix in RANGES if not holds(get(config, key))]
