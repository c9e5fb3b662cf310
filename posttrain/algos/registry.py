"""Name -> function registries, so a trainer selects estimators and losses by config name.

    estimator = get_advantage_estimator("grpo", eps=1e-6)      # options bound once, checked now
    out = estimator(AdvantageInputs(token_rewards, response_mask, group_ids=uid))
    loss_fn = get_policy_loss("vanilla", clip_ratio_high=0.28, loss_agg_mode="token-mean")
    result = loss_fn(logprobs, old_logprobs, out.advantages, response_mask, global_normalizer=n)
    kl = get_kl_estimator("low_var_kl")(logprobs, ref_logprobs)

An unknown name, or an option the chosen function does not take, raises InputError (a ValueError) listing the
valid ones. Names follow verl (`algorithm.adv_estimator`, `actor.policy_loss.loss_mode`,
`kl_penalty`). An advantage estimator reads the fields it needs from `AdvantageInputs` and raises
ValueError naming a needed field that is None (values for gae, group_ids for group estimators,
baseline_scores for remax).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from posttrain.algos import advantages as adv
from posttrain.algos.kl import KL_ESTIMATORS
from posttrain.algos.policy_loss import PolicyLossOutput, cispo_policy_loss, gspo_policy_loss, ppo_policy_loss
from posttrain.errors import InputError

__all__ = [
    "AdvantageEstimator",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "get_advantage_estimator",
    "get_policy_loss",
    "get_kl_estimator",
]

# What each AdvantageInputs field is, for the error raised when an estimator needs a missing one.
_FIELD_HINTS = {
    "values": "values (B, T) from the critic; enable the critic to use gae",
    "group_ids": "group_ids (B,), the prompt index of each response (set when prompts are repeated n times)",
    "baseline_scores": "baseline_scores (B,), the score of a greedy response to each prompt",
}


def _keyword_options(function: Callable[..., Any]) -> tuple[str, ...]:
    parameters = inspect.signature(function).parameters.values()
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_options(kind: str, name: str, function: Callable[..., Any], options: Mapping[str, Any]) -> None:
    valid = _keyword_options(function)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise InputError(
            f"{kind} {name!r} takes no option {', '.join(unknown)}; its options: {', '.join(valid) or 'none'}"
        )


def _lookup(registry: Mapping[str, Any], kind: str, name: str) -> Any:
    if name not in registry:
        raise InputError(f"unknown {kind} {name!r}; valid names: {', '.join(registry)}")
    return registry[name]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An estimator function and what it declares, which the trainer and the config check read (never
    its name): the `AdvantageInputs` fields it takes, in positional order (``values``: a critic runs;
    ``group_ids``: several samples per prompt; ``baseline_scores``: a greedy rollout of the step's
    prompts with the weights being trained, a phase before learning), its keyword options with the
    config key each is read from, and whether each group's advantage comes from its own scores alone
    (``constant_group_zero``: what ``algorithm.filter_groups.kl_groups`` needs)."""

    name: str
    function: Callable[..., adv.AdvantageOutput]
    inputs: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)  # keyword → config key, e.g. {"gamma": "algorithm.gamma"}
    constant_group_zero: bool = False  # each group's advantage from its own scores alone, all equal giving exactly 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs) - set(_FIELD_HINTS) - set(_ALWAYS))
        if unknown:
            raise ValueError(f"advantage estimator {self.name!r} takes inputs {unknown} that AdvantageInputs does not have")
        _check_options("advantage estimator", self.name, self.function, self.options)

    @property
    def needs_values(self) -> bool:
        """A critic's values (the critic runs by default)."""
        return "values" in self.inputs

    @property
    def needs_groups(self) -> bool:
        """Several samples of each prompt, compared with each other."""
        return "group_ids" in self.inputs

    @property
    def needs_greedy_baseline(self) -> bool:
        """A greedy rollout of the step's prompts with the weights being trained (ReMax), scored raw."""
        return "baseline_scores" in self.inputs

    def __call__(self, batch: adv.AdvantageInputs, **options: Any) -> adv.AdvantageOutput:
        arguments = []
        for input_name in self.inputs:
            value = getattr(batch, input_name)
            if value is None:
                raise ValueError(f"advantage estimator {self.name!r} needs {_FIELD_HINTS[input_name]}")
            arguments.append(value)
        return self.function(*arguments, **options)


_ALWAYS = ("token_rewards", "response_mask")  # every batch has them
_OUTCOME = ("token_rewards", "response_mask", "group_ids")

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    estimator.name: estimator
    for estimator in (
        AdvantageEstimator("gae", adv.gae_advantages, ("token_rewards", "values", "response_mask"),
                           {"gamma": "algorithm.gamma", "lam": "algorithm.lam"}),
        AdvantageEstimator("grpo", adv.grpo_advantages, _OUTCOME, {"scale_by_std": "algorithm.norm_adv_by_std_in_grpo"},
                           constant_group_zero=True),
        AdvantageEstimator("drgrpo", adv.drgrpo_advantages, _OUTCOME, constant_group_zero=True),
        AdvantageEstimator("rloo", adv.rloo_advantages, _OUTCOME, constant_group_zero=True),
        AdvantageEstimator("reinforce_plus_plus", adv.reinforce_plus_plus_advantages,
                           ("token_rewards", "response_mask")),
        AdvantageEstimator("reinforce_plus_plus_baseline", adv.reinforce_plus_plus_baseline_advantages, _OUTCOME),
        AdvantageEstimator("remax", adv.remax_advantages, ("token_rewards", "response_mask", "baseline_scores")),
        AdvantageEstimator("grpo_passk", adv.grpo_passk_advantages, _OUTCOME, constant_group_zero=True),
    )
}

POLICY_LOSSES: dict[str, Callable[..., PolicyLossOutput]] = {
    "vanilla": ppo_policy_loss,
    "ppo": ppo_policy_loss,
    "gspo": gspo_policy_loss,
    "cispo": cispo_policy_loss,
}


def get_advantage_estimator(name: str, **options: Any) -> Callable[[adv.AdvantageInputs], adv.AdvantageOutput]:
    """The estimator called `name`, with keyword `options` (gamma, lam, eps, ...) bound."""
    estimator: AdvantageEstimator = _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)
    _check_options("advantage estimator", name, estimator.function, options)
    return functools.partial(estimator, **options)


def get_policy_loss(name: str, **options: Any) -> Callable[..., PolicyLossOutput]:
    """The policy loss called `name`, with keyword `options` (clip ratios, loss_agg_mode, ...) bound.

    The result is called as loss(logprobs, old_logprobs, advantages, response_mask, **per_call),
    per_call being e.g. global_normalizer or token_weights.
    """
    function = _lookup(POLICY_LOSSES, "policy loss", name)
    _check_options("policy loss", name, function, options)
    return functools.partial(function, **options)


def get_kl_estimator(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The per-token KL estimator called `name`: (logprobs, ref_logprobs) -> (B, T)."""
    return _lookup(KL_ESTIMATORS, "KL estimator", name)
