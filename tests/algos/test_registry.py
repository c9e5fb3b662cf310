import pytest
import torch

from posttrain.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    cispo_policy_loss,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    grpo_advantages,
    gspo_policy_loss,
    kl_k3,
    ppo_policy_loss,
)

# verl's config names, which a trainer will look up.
VERL_ESTIMATORS = {"gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "grpo_passk"}


def _full_inputs(gen: torch.Generator) -> AdvantageInputs:
    mask = torch.ones(4, 3)
    return AdvantageInputs(token_rewards=torch.randn(4, 3, generator=gen), response_mask=mask,
                           group_ids=torch.tensor([0, 0, 1, 1]), values=torch.randn(4, 3, generator=gen),
                           baseline_scores=torch.randn(4, generator=gen))


def test_registries_hold_the_config_names():
    assert VERL_ESTIMATORS | {"drgrpo"} == set(ADVANTAGE_ESTIMATORS)
    assert POLICY_LOSSES == {"vanilla": ppo_policy_loss, "ppo": ppo_policy_loss, "gspo": gspo_policy_loss,
                             "cispo": cispo_policy_loss}
    assert {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k3+", "low_var_kl+"} == set(KL_ESTIMATORS)
    assert get_kl_estimator("low_var_kl") is kl_k3


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_runs_by_name(name, gen):
    out = get_advantage_estimator(name)(_full_inputs(gen))
    assert out.advantages.shape == out.returns.shape == (4, 3)
    assert torch.isfinite(out.advantages).all()


def test_lookup_by_name_binds_options_and_matches_the_function(gen):
    batch = _full_inputs(gen)
    by_name = get_advantage_estimator("grpo", eps=0.5)(batch)
    direct = grpo_advantages(batch.token_rewards, batch.response_mask, batch.group_ids, eps=0.5)
    torch.testing.assert_close(by_name.advantages, direct.advantages)
    loss = get_policy_loss("vanilla", clip_ratio_high=0.28)
    logprobs, advantages = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    torch.testing.assert_close(loss(logprobs, logprobs + 0.3, advantages, batch.response_mask).loss,
                               ppo_policy_loss(logprobs, logprobs + 0.3, advantages, batch.response_mask,
                                               clip_ratio_high=0.28).loss)


def test_unknown_names_and_options_list_the_valid_ones():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; valid names: gae, grpo"):
        get_advantage_estimator("ppo")
    with pytest.raises(ValueError, match="unknown policy loss 'dapo'; valid names: vanilla, ppo, gspo, cispo"):
        get_policy_loss("dapo")
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        get_kl_estimator("k4")
    with pytest.raises(ValueError, match="policy loss 'gspo' takes no option clip_ratio_dual; its options: clip_"):
        get_policy_loss("gspo", clip_ratio_dual=3.0)
    with pytest.raises(ValueError, match="advantage estimator 'rloo' takes no option gamma; its options: none"):
        get_advantage_estimator("rloo", gamma=0.9)


@pytest.mark.parametrize("name,missing", [("gae", "values"), ("grpo", "group_ids"), ("remax", "baseline_scores")])
def test_missing_inputs_are_named(name, missing, gen):
    batch = _full_inputs(gen)
    batch = AdvantageInputs(**{**batch.__dict__, missing: None})
    with pytest.raises(ValueError, match=f"advantage estimator '{name}' needs {missing}"):
        get_advantage_estimator(name)(batch)


def test_the_trainer_and_config_check_read_what_an_estimator_declares_not_its_name(monkeypatch):
    """A new estimator, registered under a name no code knows, gets a critic by default when it takes
    values, the greedy-baseline phase (and ReMax's refusals) when it takes baseline scores, n >= 2 checked
    when it takes groups, and its options read from the config keys it names."""
    from posttrain.algos.registry import AdvantageEstimator
    from posttrain.cli.preflight import load_run_config
    from posttrain.config import ConfigError, load_config
    from posttrain.config.algorithm_checks import critic_enabled, needs_greedy_baseline
    from posttrain.trainer.learn import advantage_estimator
    from posttrain.trainer.sync import GreedyBaseline, estimator_phases

    seen = {}

    def valued(token_rewards, values, response_mask, *, discount=1.0):
        seen["discount"] = discount
        return get_advantage_estimator("gae")(AdvantageInputs(token_rewards, response_mask, values=values))

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "my_valued", AdvantageEstimator(
        "my_valued", valued, ("token_rewards", "values", "response_mask"), {"discount": "algorithm.gamma"}))
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "my_baselined", AdvantageEstimator(
        "my_baselined", ADVANTAGE_ESTIMATORS["remax"].function, ("token_rewards", "response_mask", "baseline_scores")))
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "my_grouped", AdvantageEstimator(
        "my_grouped", grpo_advantages, ("token_rewards", "response_mask", "group_ids")))

    valued_config = load_config(overrides=["algorithm.adv_estimator=my_valued", "algorithm.gamma=0.5"])
    assert critic_enabled(valued_config) and not needs_greedy_baseline(valued_config)
    advantage_estimator(valued_config)(AdvantageInputs(torch.ones(2, 3), torch.ones(2, 3), values=torch.zeros(2, 3)))
    assert seen["discount"] == 0.5

    baselined = load_config(overrides=["algorithm.adv_estimator=my_baselined"])
    assert not critic_enabled(baselined) and [type(p) for p in estimator_phases(baselined, rollout=None)] == [GreedyBaseline]
    with pytest.raises(ConfigError, match="needs a greedy baseline rollout"):
        load_run_config([], ["algorithm.adv_estimator=my_baselined", "trainer.mode=async"])
    with pytest.raises(ConfigError, match="my_baselined's greedy baseline is scored for the step's first prompts"):
        load_run_config([], ["algorithm.adv_estimator=my_baselined", "algorithm.filter_groups.enable=true"])

    with pytest.raises(ConfigError, match="my_grouped compares the samples of each prompt"):
        load_run_config([], ["algorithm.adv_estimator=my_grouped", "actor_rollout_ref.rollout.n=1"])
    assert estimator_phases(load_config(overrides=["algorithm.adv_estimator=my_grouped"]), rollout=None) == []


def test_a_declaration_with_an_input_or_option_its_function_lacks_is_refused_when_written():
    from posttrain.algos.registry import AdvantageEstimator

    with pytest.raises(ValueError, match="inputs \\['rewardz'\\]"):
        AdvantageEstimator("bad", grpo_advantages, ("rewardz", "response_mask", "group_ids"))
    with pytest.raises(ValueError, match="takes no option gamma"):
        AdvantageEstimator("bad", grpo_advantages, ("token_rewards", "response_mask", "group_ids"), {"gamma": "algorithm.gamma"})


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_an_estimator_that_declares_constant_groups_zero_gives_them_zero_beside_varied_ones(name, gen):
    """What ``algorithm.filter_groups.kl_groups`` relies on: a group whose scores are all equal adds no policy gradient,
    and the groups it adds do not move the others' advantages."""
    estimator = ADVANTAGE_ESTIMATORS[name]
    inputs = _full_inputs(gen)
    constant = inputs.group_ids == inputs.group_ids[0]
    inputs.token_rewards[constant] = 0.0
    inputs.token_rewards[constant, -1] = 0.7  # every sample of the first group scores 0.7
    advantages = estimator(inputs).advantages
    flat = advantages[constant][inputs.response_mask[constant].bool()]
    if estimator.constant_group_zero:
        assert torch.equal(flat, torch.zeros_like(flat)), name
        inputs.token_rewards[~constant] *= 3.0  # the other group's scores moved: this group's advantages stay
        assert torch.equal(estimator(inputs).advantages[constant], advantages[constant]), name
    elif estimator.needs_groups:
        assert flat.abs().max() > 0, name  # a batch-wide baseline or whitening moves it: declaring it would be wrong
