"""The policy objective's π_old: a separate forward pass, or (one optimizer step per trainer step) the
update's own forward pass, detached. Both must give the same update."""

import math

import pytest
import torch

from posttrain import keys
from posttrain.config.schema import ActorConfig
from posttrain.engines.training import TrainingEngine
from posttrain.engines.training.modeling import ForwardOutputs
from posttrain.protocol import Batch
from posttrain.workers.objectives import PolicyObjective
from tests.engines.training.conftest import small_lm  # noqa: F401  (fixture)
from tests.engines.training.helpers import engine_config, make_batch, with_zero_advantages, trained


def _updated_weights(model_dir, batch: Batch) -> dict[str, torch.Tensor]:
    engine = TrainingEngine(engine_config(model_dir))
    trained(engine, batch, PolicyObjective.from_config(ActorConfig(), 8), micro_batch_size=3)
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def test_a_single_step_update_needs_no_separate_old_logprob_pass(small_lm):  # noqa: F811
    batch = make_batch(6, seed=3)
    without_old = Batch({k: v for k, v in batch.tensors.items() if k != keys.OLD_LOGPROBS}, batch.non_tensors, batch.meta)
    # the same micro-batches as the update, so the two forward passes see the same shapes (bit-equal logprobs)
    old, _ = TrainingEngine(engine_config(small_lm)).compute_logprobs(batch, micro_batch_size=3)
    with_old = without_old.union(Batch.from_dict({keys.OLD_LOGPROBS: old}))
    a, b = _updated_weights(small_lm, without_old), _updated_weights(small_lm, with_old)
    initial = {name: p for name, p in TrainingEngine(engine_config(small_lm)).module.named_parameters()}
    assert any(not torch.equal(a[name], initial[name]) for name in a)  # the step moved the weights
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def _objective_loss(objective: PolicyObjective, batch: Batch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
    normalizer = batch[keys.RESPONSE_MASK].sum()
    return objective(ForwardOutputs(logprobs=logprobs, entropy=None, values=None), batch, normalizer)


def test_the_behaviour_correction_weights_each_token_by_proximal_over_behaviour_truncated():
    from posttrain.algos import ppo_policy_loss

    batch = make_batch(4, seed=5)
    mask, old = batch[keys.RESPONSE_MASK], batch[keys.OLD_LOGPROBS]
    behaviour = old + torch.linspace(-1.5, 1.5, old.numel()).reshape(old.shape)  # some tokens far off-policy
    batch = batch.union(Batch.from_dict({keys.BEHAVIOUR_LOGPROBS: behaviour}))
    logprobs = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
    corrected = PolicyObjective.from_config(ActorConfig(), 8, importance_cap=2.0)
    loss, metrics = _objective_loss(corrected, batch, logprobs)
    weights = torch.exp(old - behaviour).clamp(max=2.0) * mask  # by hand: min(π_prox / μ, 2)
    expected = ppo_policy_loss(logprobs, old, batch[keys.ADVANTAGES], mask, token_weights=weights,
                               clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_dual=3.0, global_normalizer=mask.sum())
    torch.testing.assert_close(loss, expected.loss)
    assert 0 < float(metrics["behaviour_weight_truncated"]) < 1  # some tokens hit the cap, not all

    # a behaviour policy equal to the proximal one: weight 1 everywhere, the plain loss
    same = Batch(batch.tensors | {keys.BEHAVIOUR_LOGPROBS: old.clone()}, batch.non_tensors, batch.meta)
    plain, _ = _objective_loss(PolicyObjective.from_config(ActorConfig(), 8), same, logprobs)
    torch.testing.assert_close(_objective_loss(corrected, same, logprobs)[0], plain)


def test_loss_scale_factor_gives_verls_token_sum_norm_for_every_actor_term():
    # With π = π_old (ratio 1, no clip) PPO's per-token loss is -A, the KL loss is 0 and the entropy
    # bonus is subtracted: loss = (sum_i sum_t m (-A - 0.1 H)) / K, the sequence count left out (verl).
    batch = make_batch(4, seed=7)
    mask, old, advantages = batch[keys.RESPONSE_MASK], batch[keys.OLD_LOGPROBS], batch[keys.ADVANTAGES]
    batch = batch.union(Batch.from_dict({keys.REF_LOGPROBS: old.clone()}))
    entropy = torch.rand(old.shape, generator=torch.Generator().manual_seed(1))
    actor = ActorConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=5, entropy_coeff=0.1, use_kl_loss=True)
    loss, metrics = PolicyObjective.from_config(actor, 8)(ForwardOutputs(logprobs=old, entropy=entropy, values=None),
                                                          batch, torch.tensor(4.0))
    torch.testing.assert_close(loss, ((-advantages - 0.1 * entropy) * mask).sum() / 5)
    ours, _ = PolicyObjective.from_config(ActorConfig(loss_agg_mode="seq-mean-token-sum-norm", entropy_coeff=0.1),
                                          8)(ForwardOutputs(logprobs=old, entropy=entropy, values=None), batch, torch.tensor(4.0))
    torch.testing.assert_close(ours, ((-advantages - 0.1 * entropy) * mask).sum() / (4 * 8))  # N = 4 sequences, L = 8
    assert metrics["ppo_kl"].item() == 0.0 and metrics["ppo_kl_k3"].item() == 0.0


def test_actor_ppo_kl_is_the_mean_of_old_minus_new_logprobs():
    batch = make_batch(3, seed=2)
    mask, old = batch[keys.RESPONSE_MASK], batch[keys.OLD_LOGPROBS]
    new = old - 0.25 * mask  # every valid token 0.25 less likely in log space: k1 = 0.25
    _, metrics = _objective_loss(PolicyObjective.from_config(ActorConfig(), 8), batch, new)
    assert metrics["ppo_kl"].item() == pytest.approx(0.25)
    assert metrics["ppo_kl_k3"].item() == pytest.approx(math.exp(-0.25) - 1 + 0.25)  # e^x - 1 - x, x = -0.25


@pytest.mark.parametrize(("policy_loss", "loss_agg_mode", "importance_cap"), [
    ("vanilla", "token-mean", None), ("vanilla", "seq-mean-token-mean", None), ("vanilla", "seq-mean-token-sum", None),
    ("vanilla", "seq-mean-token-sum-norm", None), ("gspo", "seq-mean-token-mean", None), ("cispo", "token-mean", None),
    ("vanilla", "token-mean", 2.0),
])
def test_skipping_rows_without_gradient_gives_the_same_update(small_lm, policy_loss, loss_agg_mode, importance_cap):  # noqa: F811
    # the update of every policy loss and aggregation (and with the behaviour correction of async
    # training), with the rows of zero advantage run and not run: the same weights
    batch = with_zero_advantages(make_batch(8, seed=7), [1, 2, 5])
    behaviour = batch[keys.OLD_LOGPROBS] + 0.3 * torch.randn(batch[keys.OLD_LOGPROBS].shape, generator=torch.Generator().manual_seed(1))
    batch = batch.union(Batch.from_dict({keys.BEHAVIOUR_LOGPROBS: behaviour}))
    actor = ActorConfig(policy_loss=policy_loss, loss_agg_mode=loss_agg_mode)
    objective = PolicyObjective.from_config(actor, 8, importance_cap=importance_cap)
    skip = objective.rows_without_gradient(batch)
    assert skip.tolist() == [False, True, True, False, False, True, False, False]
    initial = TrainingEngine(engine_config(small_lm, eps=1.0, lr=1e-2))
    results = []
    for rows in (None, skip):
        engine = TrainingEngine(engine_config(small_lm, eps=1.0, lr=1e-2))
        metrics = trained(engine, batch, objective, micro_batch_size=3, loss_agg_mode=loss_agg_mode, skip_rows=rows)
        results.append((metrics, dict(engine.module.named_parameters())))
    (full, full_params), (skipped, skipped_params) = results
    assert skipped["actor/rows_skipped"] == 3 / 8 and skipped["actor/micro_batches"] == 2 < full["actor/micro_batches"]
    assert full["actor/loss"] == pytest.approx(skipped["actor/loss"], rel=1e-5)
    assert full["actor/grad_norm"] == pytest.approx(skipped["actor/grad_norm"], rel=1e-5)
    moved = max((full_params[n] - p).abs().max().item() for n, p in initial.module.named_parameters())
    assert moved > 1e-4
    for name, param in full_params.items():
        torch.testing.assert_close(skipped_params[name], param, rtol=0, atol=1e-7)


def test_rows_without_gradient_need_the_advantage_zero_at_every_response_token():
    batch = make_batch(4, seed=8)
    advantages, mask = batch[keys.ADVANTAGES].clone(), batch[keys.RESPONSE_MASK]
    advantages[0] = 0.0
    advantages[1] = torch.where(mask[1].bool(), 0.0, 5.0)  # nonzero only under padding: no gradient either
    advantages[2, 1:] = 0.0  # one real token left with an advantage
    batch = Batch(batch.tensors | {keys.ADVANTAGES: advantages}, batch.non_tensors, batch.meta)
    plain = PolicyObjective.from_config(ActorConfig(), 8)
    assert plain.rows_without_gradient(batch).tolist() == [True, True, False, False]
    # an entropy bonus or a KL loss gives every row a gradient of its own
    assert PolicyObjective.from_config(ActorConfig(entropy_coeff=0.01), 8).rows_without_gradient(batch) is None
    assert PolicyObjective.from_config(ActorConfig(use_kl_loss=True), 8).rows_without_gradient(batch) is None


def test_policy_loss_skip_first_leaves_each_responses_first_tokens_to_the_kl_alone():
    # Gradient with respect to each token's log-probability: with skip 2 the first two scored tokens of every row
    # (a row whose mask starts later, as an agent's episode with an observation first, counts from its own first)
    # get no policy-loss gradient and the others get exactly what they get without the skip; the KL loss still
    # reaches the skipped ones.
    batch = make_batch(4, seed=9)
    mask = batch[keys.RESPONSE_MASK].clone()
    mask[1] = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0], dtype=mask.dtype)  # row 1's scored tokens start at column 3
    batch = Batch(batch.tensors | {keys.RESPONSE_MASK: mask, keys.REF_LOGPROBS: batch[keys.OLD_LOGPROBS] - 0.3},
                  batch.non_tensors, batch.meta)

    def grad(actor: ActorConfig) -> torch.Tensor:
        logprobs = batch[keys.OLD_LOGPROBS].clone().requires_grad_(True)
        _objective_loss(PolicyObjective.from_config(actor, 8), batch, logprobs)[0].backward()
        return logprobs.grad

    full, skipped = grad(ActorConfig()), grad(ActorConfig(policy_loss_skip_first=2))
    first_two = (mask.cumsum(dim=-1) <= 2) & mask.bool()
    assert int(first_two.sum()) == 2 * mask.shape[0] and first_two[1, 3:5].all() and not first_two[1, :3].any()
    assert (full[first_two] != 0).all() and (skipped[first_two] == 0).all()
    torch.testing.assert_close(skipped[~first_two], full[~first_two])
    with_kl = grad(ActorConfig(policy_loss_skip_first=2, use_kl_loss=True, kl_loss_coef=0.5))
    assert (with_kl[first_two] != 0).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_kl_loss_first_tokens_puts_the_kl_on_each_responses_first_tokens_only(mode):
    # Gradient with respect to each token's log-probability, the policy loss left out (zero advantages): with the KL
    # on the first 2 tokens, each row's first two scored tokens (row 1's start at column 3, row 2's have a gap as an
    # agent episode's turns do) get exactly the KL gradient they get with the KL on every token (the same per-token
    # weight and normaliser, whatever the aggregation), the others none.
    batch = _kl_only_batch(seed=11)
    mask = batch[keys.RESPONSE_MASK]

    every = _logprob_grad(batch, ActorConfig(use_kl_loss=True, kl_loss_coef=0.5, loss_agg_mode=mode))
    first = _logprob_grad(batch, ActorConfig(use_kl_loss=True, kl_loss_coef=0.5, loss_agg_mode=mode, kl_loss_first_tokens=2))
    first_two = (mask.cumsum(dim=-1) <= 2) & mask.bool()
    assert first_two[1, 3:5].all() and not first_two[1, :3].any()
    assert first_two[2].tolist() == [True, False, False, True, False, False, False, False]
    assert (every[mask.bool()] != 0).all()
    torch.testing.assert_close(first[first_two], every[first_two])
    assert (first[~first_two] == 0).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_kl_loss_first_token_weight_multiplies_the_kl_gradient_on_each_responses_first_token_only(mode):
    # Gradient with respect to each token's log-probability, the policy loss left out (zero advantages): with the first
    # token's weight 20, each row's first scored token (row 1's at column 3, row 2's at column 0 before a gap) gets 20
    # times the KL gradient it gets at weight 1, every other token the same; with kl_loss_first_tokens=2 as well, the
    # second token keeps its own weight and the rest none.
    batch = _kl_only_batch(seed=12)
    mask = batch[keys.RESPONSE_MASK]

    def grad(**options) -> torch.Tensor:
        return _logprob_grad(batch, ActorConfig(use_kl_loss=True, kl_loss_coef=0.5, loss_agg_mode=mode, **options))

    alike, weighted = grad(), grad(kl_loss_first_token_weight=20.0)
    first = (mask.cumsum(dim=-1) == 1) & mask.bool()
    assert first[1].tolist() == [False] * 3 + [True] + [False] * 4 and first[2].tolist() == [True] + [False] * 7
    assert (alike[mask.bool()] != 0).all()
    torch.testing.assert_close(weighted[first], 20 * alike[first])
    torch.testing.assert_close(weighted[~first], alike[~first])
    narrowed = grad(kl_loss_first_token_weight=20.0, kl_loss_first_tokens=2)
    second = (mask.cumsum(dim=-1) == 2) & mask.bool()
    torch.testing.assert_close(narrowed[first], 20 * alike[first])
    torch.testing.assert_close(narrowed[second], alike[second])
    assert (narrowed[~(first | second)] == 0).all()


def _kl_only_batch(seed: int) -> Batch:
    """A batch of 4 whose policy loss is 0 (zero advantages) and whose KL to the reference is not (REF_LOGPROBS 0.3
    below OLD_LOGPROBS): row 1's response starts at column 3, row 2's has a gap after its first token, as an agent
    episode's turns do."""
    batch = make_batch(4, seed=seed)
    mask = batch[keys.RESPONSE_MASK].clone()
    mask[1] = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0], dtype=mask.dtype)
    mask[2] = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0], dtype=mask.dtype)
    return Batch(batch.tensors | {keys.RESPONSE_MASK: mask, keys.REF_LOGPROBS: batch[keys.OLD_LOGPROBS] - 0.3,
                                  keys.ADVANTAGES: torch.zeros_like(batch[keys.ADVANTAGES])}, batch.non_tensors, batch.meta)


def _logprob_grad(batch: Batch, actor: ActorConfig) -> torch.Tensor:
    """The policy objective's gradient with respect to each token's log-probability, at OLD_LOGPROBS."""
    logprobs = batch[keys.OLD_LOGPROBS].clone().requires_grad_(True)
    _objective_loss(PolicyObjective.from_config(actor, 8), batch, logprobs)[0].backward()
    return logprobs.grad
