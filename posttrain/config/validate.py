"""Checks on a whole config, run once before any worker starts. Each returns problems, never raises,
so that a user sees every mistake in one go."""

from __future__ import annotations

from posttrain.config.loader import ConfigProblem
from posttrain.config.schema import PosttrainConfig

CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right"),
    "actor_rollout_ref.rollout.name": ("vllm", "hf"),
    "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "actor_rollout_ref.actor.dtype": ("bfloat16", "float32"),  # float16 would need loss scaling
    "actor_rollout_ref.actor.optim.lr_scheduler": ("constant", "cosine"),
    "critic.optim.lr_scheduler": ("constant", "cosine"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "reward_model.reward_manager": ("naive", "batch"),
}

POSITIVE: tuple[str, ...] = (
    "data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.n", "critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size_per_gpu",
    "critic.ppo_epochs", "trainer.nnodes", "trainer.n_workers_per_node", "trainer.total_epochs",
)


def get(config: object, key: str) -> object:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def validate_config(config: PosttrainConfig) -> list[ConfigProblem]:
    problems = _check_choices(config) + _check_positive(config)
    if not any(p.key in POSITIVE for p in problems):
        problems += check_batch_arithmetic(config)
    return problems


def _check_choices(config: PosttrainConfig) -> list[ConfigProblem]:
    return [
        ConfigProblem(key, get(config, key), "config", f"must be one of {', '.join(allowed)}")
        for key, allowed in CHOICES.items()
        if get(config, key) not in allowed
    ]


def _check_positive(config: PosttrainConfig) -> list[ConfigProblem]:
    problems = [ConfigProblem(key, get(config, key), "config", "must be >= 1") for key in POSITIVE if get(config, key) < 1]
    if config.trainer.critic_warmup < 0:
        problems.append(ConfigProblem("trainer.critic_warmup", config.trainer.critic_warmup, "config", "must be >= 0"))
    return problems


def check_batch_arithmetic(config: PosttrainConfig) -> list[ConfigProblem]:
    """The divisibility a PPO/GRPO step needs, with the numbers that disagree in each message."""
    data, actor, rollout = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    ranks = config.trainer.nnodes * config.trainer.n_workers_per_node
    problems: list[ConfigProblem] = []
    sections = [("actor_rollout_ref.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz)]
    if critic_enabled(config):
        sections.append(("critic", config.critic.ppo_mini_batch_size, config.critic.ppo_micro_batch_size_per_gpu, False))
    for section, mini, micro, dynamic in sections:
        if data.train_batch_size % mini:
            problems.append(ConfigProblem(
                f"{section}.ppo_mini_batch_size", mini, "config",
                f"must divide data.train_batch_size={data.train_batch_size} (both count prompts); "
                f"e.g. set it to {_largest_divisor_at_most(data.train_batch_size, mini)}",
            ))
            continue
        samples = mini * rollout.n
        if samples % ranks:
            problems.append(ConfigProblem(
                f"{section}.ppo_mini_batch_size", mini, "config",
                f"{mini} prompts × rollout.n={rollout.n} = {samples} samples per mini-batch do not split over "
                f"{ranks} rank(s) (trainer.nnodes × trainer.n_workers_per_node); make it a multiple of {ranks}",
            ))
            continue
        per_rank = samples // ranks
        if not dynamic and per_rank % micro:
            problems.append(ConfigProblem(
                f"{section}.ppo_micro_batch_size_per_gpu", micro, "config",
                f"must divide the {per_rank} samples each rank gets per mini-batch ({mini} prompts × n={rollout.n} / "
                f"{ranks} ranks); e.g. set it to {_largest_divisor_at_most(per_rank, micro)}",
            ))
    return problems


def critic_enabled(config: PosttrainConfig) -> bool:
    """The critic runs when asked to, or by default when the advantage estimator needs values."""
    if config.critic.enable is None:
        return config.algorithm.adv_estimator == "gae"
    return config.critic.enable


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
