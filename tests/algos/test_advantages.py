import math

import pytest
import torch

from posttrain.algos import (
    drgrpo_advantages,
    gae_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    rloo_advantages,
)

from .helpers import SHAPES, random_mask, rows

# ---------------------------------------------------------------- slow references (plain loops)


def _loop_whiten(table: list[list[float]], mask: torch.Tensor) -> list[list[float]]:
    xs = [table[b][t] for b, positions in enumerate(rows(mask)) for t in positions]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return [[(x - mean) / math.sqrt(var + 1e-8) if m else 0.0 for x, m in zip(r, mr)]
            for r, mr in zip(table, mask.tolist())]


def _loop_gae(rewards, values, mask, gamma, lam):
    advantages = [[0.0] * len(r) for r in rewards.tolist()]
    returns = [[0.0] * len(r) for r in rewards.tolist()]
    for b, positions in enumerate(rows(mask)):
        running = 0.0
        for k in reversed(range(len(positions))):
            t = positions[k]
            next_value = values[b, positions[k + 1]].item() if k + 1 < len(positions) else 0.0
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lam * running
            advantages[b][t] = running
            returns[b][t] = running + values[b, t].item()
    return advantages, returns


def _loop_discounted(rewards, mask, gamma):
    out = [[0.0] * len(r) for r in rewards.tolist()]
    for b, positions in enumerate(rows(mask)):
        running = 0.0
        for t in reversed(positions):
            running = rewards[b, t].item() + gamma * running
            out[b][t] = running
    return out


def _loop_scores(rewards, mask):
    return [sum(rewards[b, t].item() for t in positions) for b, positions in enumerate(rows(mask))]


def _loop_groups(group_ids):
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    return [groups[g] for g in group_ids.tolist()]


def _loop_outcome(scores, group_ids, kind):
    out = []
    for i, members in enumerate(_loop_groups(group_ids)):
        xs = [scores[j] for j in members]
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        flat = max(xs) == min(xs)
        if kind == "grpo":
            out.append(0.0 if flat else (scores[i] - mean) / (std + 1e-6))
        elif kind == "drgrpo" or kind == "rf++baseline":
            out.append(0.0 if flat else scores[i] - mean)
        elif kind == "rloo":
            others = [scores[j] for j in members if j != i]
            out.append(0.0 if flat or not others else scores[i] - sum(others) / len(others))
        elif kind == "passk":
            ranked = sorted(members, key=lambda j: (-scores[j], j))
            out.append(scores[ranked[0]] - scores[ranked[1]] if len(ranked) > 1 and ranked[0] == i else 0.0)
    return out


def _spread(per_sequence, mask):
    return [[per_sequence[b] if m else 0.0 for m in row] for b, row in enumerate(mask.tolist())]


def _inputs(shape, gen, *, discrete=False):
    mask = random_mask(*shape, gen)
    rewards = torch.randn(shape, generator=gen, dtype=torch.float64)
    if discrete:  # ties and constant groups, as 0/1 correctness scores give
        rewards = torch.randint(0, 2, shape, generator=gen).double() * (torch.rand(shape, generator=gen) < 0.3)
    group_ids = torch.randint(0, max(1, shape[0] // 2), (shape[0],), generator=gen)
    return rewards, mask, group_ids


def _close(actual: torch.Tensor, expected: list[list[float]]):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95)])
def test_gae_matches_loop(shape, gamma, lam, gen):
    rewards, mask, _ = _inputs(shape, gen)
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    expected_adv, expected_ret = _loop_gae(rewards, values, mask, gamma, lam)
    out = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, whiten=False)
    _close(out.advantages, expected_adv)
    _close(out.returns, expected_ret)
    _close(gae_advantages(rewards, values, mask, gamma=gamma, lam=lam).advantages, _loop_whiten(expected_adv, mask))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["grpo", "drgrpo", "rloo", "passk"])
@pytest.mark.parametrize("discrete", [False, True])
def test_outcome_estimators_match_loops(shape, kind, discrete, gen):
    rewards, mask, group_ids = _inputs(shape, gen, discrete=discrete)
    function = {"grpo": grpo_advantages, "drgrpo": drgrpo_advantages, "rloo": rloo_advantages,
                "passk": grpo_passk_advantages}[kind]
    expected = _spread(_loop_outcome(_loop_scores(rewards, mask), group_ids, kind), mask)
    out = function(rewards, mask, group_ids)
    _close(out.advantages, expected)
    _close(out.returns, expected)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_reinforce_plus_plus_matches_loop(shape, gamma, gen):
    rewards, mask, _ = _inputs(shape, gen)
    returns = _loop_discounted(rewards, mask, gamma)
    out = reinforce_plus_plus_advantages(rewards, mask, gamma=gamma)
    _close(out.returns, returns)
    _close(out.advantages, _loop_whiten(returns, mask))


@pytest.mark.parametrize("shape", SHAPES)
def test_reinforce_plus_plus_baseline_matches_loop(shape, gen):
    rewards, mask, group_ids = _inputs(shape, gen)
    centred = _spread(_loop_outcome(_loop_scores(rewards, mask), group_ids, "rf++baseline"), mask)
    _close(reinforce_plus_plus_baseline_advantages(rewards, mask, group_ids).advantages, _loop_whiten(centred, mask))


@pytest.mark.parametrize("shape", SHAPES)
def test_remax_matches_loop(shape, gen):
    rewards, mask, _ = _inputs(shape, gen)
    baseline = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    scores = _loop_scores(rewards, mask)
    expected = _spread([s - b for s, b in zip(scores, baseline.tolist())], mask)
    out = remax_advantages(rewards, mask, baseline)
    _close(out.advantages, expected)
    _close(out.returns, _loop_discounted(rewards, mask, 1.0))


# ---------------------------------------------------------------- hand-worked numbers


def test_gae_hand_worked():
    # One sequence, 3 valid tokens, reward 1 on the last; values 0.5, 0.25, 0.5; gamma 0.5, lam 0.5.
    # delta_2 = 1 + 0.5 * 0 - 0.5 = 0.5;  delta_1 = 0 + 0.5 * 0.5 - 0.25 = 0;  delta_0 = 0 + 0.5 * 0.25 - 0.5 = -0.375
    # A_2 = 0.5;  A_1 = 0 + 0.25 * 0.5 = 0.125;  A_0 = -0.375 + 0.25 * 0.125 = -0.34375
    # returns = A + V = -0.34375 + 0.5, 0.125 + 0.25, 0.5 + 0.5 = 0.15625, 0.375, 1.0
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5, whiten=False)
    assert out.advantages.tolist() == [[-0.34375, 0.125, 0.5, 0.0]]
    assert out.returns.tolist() == [[0.15625, 0.375, 1.0, 0.0]]


def test_gae_skips_masked_observation_tokens():
    # Valid tokens 0 and 2 (token 1 is an observation): gamma = lam = 1, values 0.5 (t0), 0.25 (t2).
    # delta_2 = 1 - 0.25 = 0.75;  delta_0 = 0 + 0.25 - 0.5 = -0.25;  A_0 = -0.25 + 0.75 = 0.5
    out = gae_advantages(torch.tensor([[0.0, 7.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.25]]),
                         torch.tensor([[1, 0, 1]]), whiten=False)
    assert out.advantages.tolist() == [[0.5, 0.0, 0.75]]


def test_outcome_estimators_hand_worked():
    # Group 0: scores 1, 0, 0, 1 (mean 0.5, std sqrt(1/3) = 0.57735); group 1: score 3 alone.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0])
    mask = torch.ones(5, 2)
    group_ids = torch.tensor([0, 0, 0, 0, 1])
    # GRPO: +-0.5 / 0.57735 = +-0.866025 (eps 1e-6 changes the 6th digit); single member -> 0
    assert grpo_advantages(scores, mask, group_ids).advantages[:, 0].tolist() == pytest.approx(
        [0.866025, -0.866025, -0.866025, 0.866025, 0.0], abs=1e-5)
    # Dr.GRPO: +-0.5
    assert drgrpo_advantages(scores, mask, group_ids).advantages[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5, 0.0]
    # RLOO: 1 - (0 + 0 + 1) / 3 = 0.666667; 0 - (1 + 0 + 1) / 3 = -0.666667
    assert rloo_advantages(scores, mask, group_ids).advantages[:, 0].tolist() == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0])
    # pass@k: best (index 0, tie with 3 broken by index) minus second best (1) = 0
    assert grpo_passk_advantages(scores, mask, group_ids).advantages.abs().sum().item() == 0.0
    # ReMax: scores minus greedy baseline 0.5, 0.5, 0.5, 0.5, 2 -> 0.5, -0.5, -0.5, 0.5, 1
    baseline = torch.tensor([0.5, 0.5, 0.5, 0.5, 2.0])
    assert remax_advantages(scores, mask, baseline).advantages[:, 1].tolist() == [0.5, -0.5, -0.5, 0.5, 1.0]
    # ... and its returns are the scores themselves (a score is a reward on the last token), not s - b
    assert remax_advantages(scores, mask, baseline).returns[:, 1].tolist() == [1.0, 0.0, 0.0, 1.0, 3.0]


def test_remax_returns_are_verls_reward_to_go():
    # Token rewards 0.5, 0 (masked, ignored: 9), 1, 2 -> score 3.5; greedy baseline 1.
    # Advantages: 3.5 - 1 = 2.5 on every valid token. Returns, verl's reward-to-go sum_{t' >= t} r_t':
    # 3.5, (masked) 0, 3, 2.
    rewards = torch.tensor([[0.5, 9.0, 1.0, 2.0]])
    out = remax_advantages(rewards, torch.tensor([[1, 0, 1, 1]]), torch.tensor([1.0]))
    assert out.advantages.tolist() == [[2.5, 0.0, 2.5, 2.5]]
    assert out.returns.tolist() == [[3.5, 0.0, 3.0, 2.0]]


def test_passk_hand_worked():
    # Group scores 0.2, 0.9, 0.5: only the best (0.9) moves, by 0.9 - 0.5 = 0.4.
    out = grpo_passk_advantages(torch.tensor([0.2, 0.9, 0.5]), torch.ones(3, 1), torch.zeros(3, dtype=torch.long))
    assert out.advantages[:, 0].tolist() == pytest.approx([0.0, 0.4, 0.0])


def test_reinforce_plus_plus_hand_worked():
    # Rewards (0, 1) and (2,), gamma 0.5 -> returns (0.5, 1) and (2,).
    # Whitening 0.5, 1, 2: mean 7/6; var ((2/3)^2 + (1/6)^2 + (5/6)^2) / 2 = (16 + 1 + 25) / 72 = 0.583333
    rewards = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    assert out.returns.tolist() == [[0.5, 1.0], [2.0, 0.0]]
    std = math.sqrt(0.583333333)
    expected = [(0.5 - 7 / 6) / std, (1 - 7 / 6) / std, (2 - 7 / 6) / std, 0.0]
    assert out.advantages.flatten().tolist() == pytest.approx(expected, abs=1e-5)


def test_token_rewards_and_scores_give_the_same_advantages(gen):
    rewards, mask, group_ids = _inputs((6, 5), gen)
    scores = (rewards * mask).sum(-1)
    torch.testing.assert_close(grpo_advantages(rewards, mask, group_ids).advantages,
                               grpo_advantages(scores, mask, group_ids).advantages)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("function", [grpo_advantages, rloo_advantages, grpo_passk_advantages,
                                      reinforce_plus_plus_baseline_advantages])
def test_empty_rows_and_singletons_give_zero_not_nan(function):
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [5.0, 1.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 1]])
    out = function(rewards, mask, torch.tensor([0, 0, 1]))
    assert torch.isfinite(out.advantages).all()
    assert out.advantages[1].tolist() == [0.0, 0.0]


def test_nan_reward_names_the_sample():
    rewards = torch.zeros(4, 3)
    rewards[2, 1] = float("nan")
    with pytest.raises(ValueError, match="sample index 2"):
        grpo_advantages(rewards, torch.ones(4, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="sample index 2"):
        gae_advantages(rewards, torch.zeros(4, 3), torch.ones(4, 3))


def test_mismatched_shapes_are_named():
    with pytest.raises(ValueError, match=r"token_rewards \(2, 3\).*values \(2, 4\)"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"rewards has shape \(3,\)"):
        grpo_advantages(torch.zeros(3), torch.ones(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="token-level rewards"):
        reinforce_plus_plus_advantages(torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="baseline_scores"):
        remax_advantages(torch.zeros(2), torch.ones(2, 3), torch.zeros(3))


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk"])
def test_per_episode_counts_each_episode_once_whatever_the_estimator(name):
    """Episodes a (two samples, score 1), b (0) and c (0, its second sample trains nothing): the same
    advantages as the estimator gives three one-sample episodes, each on all of its samples' tokens; an
    episode's score is its samples' mean (a shaping term on one sample moves the whole episode)."""
    from posttrain.algos import AdvantageInputs, per_episode
    from posttrain.algos.registry import get_advantage_estimator

    estimator = get_advantage_estimator(name)
    rewards, mask = torch.zeros(5, 3), torch.ones(5, 3)
    rewards[0, 2] = rewards[1, 1] = 1.0
    mask[4] = 0
    index = torch.tensor([0, 0, 1, 2, 2])
    out = per_episode(estimator, AdvantageInputs(rewards, mask, group_ids=torch.zeros(5, dtype=torch.long)), index)
    alone = estimator(AdvantageInputs(torch.tensor([[1.0], [0.0], [0.0]]), torch.ones(3, 1), group_ids=torch.zeros(3, dtype=torch.long)))
    assert torch.allclose(out.advantages[:4], alone.advantages[index[:4], 0].unsqueeze(-1).expand(4, 3))
    assert out.advantages[4].abs().sum() == 0
    shaped = rewards.clone()
    shaped[1, 2] -= 0.5  # e.g. an overlong penalty on the second sample only: the episode's score is 0.75
    moved = per_episode(estimator, AdvantageInputs(shaped, mask, group_ids=torch.zeros(5, dtype=torch.long)), index)
    expected = estimator(AdvantageInputs(torch.tensor([[0.75], [0.0], [0.0]]), torch.ones(3, 1), group_ids=torch.zeros(3, dtype=torch.long)))
    assert torch.allclose(moved.advantages[:2, 0], expected.advantages[0, 0].expand(2))
