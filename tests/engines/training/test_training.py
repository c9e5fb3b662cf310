"""train_mini_batch: the same update under any split, skipped non-finite steps, clipping, schedule, errors.

Tolerances. AdamW's first step is lr * g / (|g| + eps): with the default eps (1e-8) it is
lr * sign(g) wherever |g| >> eps, so the few elements whose gradient is ~1e-8 turn rounding noise
into a visible difference. These tests use eps = 1, where the step is nearly proportional to the
gradient, so comparing parameters compares gradients: equal to 1e-7 (a few float32 ulps of weights
~0.1) while the update itself is > 1e-4.
"""

import math

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from tests.engines.training.helpers import (
    critic_loss,
    engine_config,
    make_batch,
    max_difference,
    parameters,
    ppo_entropy_loss,
    ppo_loss,
    trained,
    with_zero_advantages,
)

EXACT = {"eps": 1.0, "lr": 1e-2}


@pytest.mark.parametrize("with_entropy", [False, True])
def test_any_split_gives_the_same_update(small_lm, with_entropy):
    batch = make_batch(8, seed=1)
    loss_fn = ppo_entropy_loss if with_entropy else ppo_loss
    before = parameters(TrainingEngine(engine_config(small_lm, **EXACT)))
    results = {}
    for name, split in {"full": {}, "one": {"micro_batch_size": 1}, "three": {"micro_batch_size": 3},
                        "tokens": {"max_tokens": 30}}.items():
        engine = TrainingEngine(engine_config(small_lm, **EXACT))
        metrics = trained(engine, batch, loss_fn, with_entropy=with_entropy, **split)
        results[name] = (parameters(engine), metrics)
    full_params, full_metrics = results["full"]
    assert max_difference(full_params, before) > 1e-4
    assert results["tokens"][1]["actor/micro_batches"] > 2
    for name, (params, metrics) in results.items():
        assert max_difference(params, full_params) < 1e-7, name
        for metric in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl"):
            assert metrics[metric] == pytest.approx(full_metrics[metric], rel=1e-5, abs=1e-7), (name, metric)


def test_gradient_checkpointing_gives_the_same_update(small_lm):
    batch = make_batch(4, seed=2)
    plain = TrainingEngine(engine_config(small_lm, **EXACT))
    checkpointed = TrainingEngine(engine_config(small_lm, gradient_checkpointing=True, **EXACT))
    trained(plain, batch, ppo_loss, micro_batch_size=2)
    trained(checkpointed, batch, ppo_loss, micro_batch_size=2)
    assert max_difference(parameters(plain), parameters(checkpointed)) < 1e-7


def _poisoned(value):
    def loss_fn(outputs, micro_batch, normalizer):
        loss, metrics = ppo_loss(outputs, micro_batch, normalizer)
        return loss * value, metrics  # only the second micro-batch goes bad, after good gradients
    calls = []

    def first_good(outputs, micro_batch, normalizer):
        calls.append(1)
        return loss_fn(outputs, micro_batch, normalizer) if len(calls) == 2 else ppo_loss(outputs, micro_batch, normalizer)
    return first_good


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_loss_skips_the_step_and_changes_nothing(small_lm, bad):
    batch = make_batch(4, seed=3)
    engine = TrainingEngine(engine_config(small_lm, warmup_steps=4))
    first = trained(engine, batch, ppo_loss, micro_batch_size=2)  # Adam has state from here on
    weights = parameters(engine)
    adam = {k: v.clone() for k, v in engine.optimizer.state_dict()["state"][0].items()}
    metrics = trained(engine, batch, _poisoned(bad), micro_batch_size=2)
    assert metrics["actor/skipped"] == 1.0 and metrics["actor/skipped_total"] == 1.0
    assert not math.isfinite(metrics["actor/grad_norm"])
    after = parameters(engine)
    assert all(torch.equal(weights[k], after[k]) for k in weights)  # bitwise
    assert all(torch.equal(adam[k], v) for k, v in engine.optimizer.state_dict()["state"][0].items())
    assert engine.global_step == 1 and all(p.grad is None for p in engine.trainable_parameters)
    # The schedule did not advance: the next good step uses the lr the skipped one would have.
    good = trained(engine, batch, ppo_loss, micro_batch_size=2)
    assert (first["actor/lr"], metrics["actor/lr"], good["actor/lr"]) == pytest.approx((0.25e-3, 0.5e-3, 0.5e-3))
    assert good["actor/skipped"] == 0.0 and max_difference(parameters(engine), weights) > 0


def test_clipping_scales_the_gradient_to_the_max_norm(small_lm):
    # lr = eps = 1e4 makes AdamW's first step g * 1e4 / (|g| + 1e4) = g to 1e-6: the update is the gradient.
    batch = make_batch(4, seed=4)
    linear = {"eps": 1e4, "lr": 1e4, "weight_decay": 0.0}
    start = parameters(TrainingEngine(engine_config(small_lm, **linear)))
    unclipped = TrainingEngine(engine_config(small_lm, grad_clip=None, **linear))
    norm = trained(unclipped, batch, ppo_loss)["actor/grad_norm"]
    clipped = TrainingEngine(engine_config(small_lm, grad_clip=norm / 4, **linear))
    assert trained(clipped, batch, ppo_loss)["actor/grad_norm"] == pytest.approx(norm, rel=1e-6)
    free, capped = parameters(unclipped), parameters(clipped)
    for name in start:
        torch.testing.assert_close(capped[name] - start[name], (free[name] - start[name]) / 4, atol=1e-6, rtol=1e-3)


def test_the_critic_learns_the_returns(small_lm):
    engine = TrainingEngine(engine_config(small_lm, value_head=True, metric_prefix="critic"))
    batch = make_batch(4, seed=5)
    batch.tensors[keys.RETURNS] = torch.full_like(batch[keys.VALUES], 0.25)
    losses = []
    for _ in range(10):
        batch.tensors[keys.VALUES] = engine.compute_values(batch)  # PPO's old values, refreshed each round
        losses.append(trained(engine, batch, critic_loss, micro_batch_size=2)["critic/loss"])
    assert losses[-1] < 0.1 * losses[0], losses
    assert "critic/vf_clipfrac" in trained(engine, batch, critic_loss)


def test_bad_inputs_say_what_to_fix(small_lm, tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        TrainingEngine(engine_config(tmp_path / "no-such-model"))
    (tmp_path / "config.json").write_text('{"model_type": "vit"}')
    with pytest.raises(ValueError, match="model_type='vit'.*causal language model"):
        TrainingEngine(engine_config(tmp_path))
    engine = TrainingEngine(engine_config(small_lm))
    batch = make_batch(2)
    with pytest.raises(KeyError, match="response_mask"):
        trained(engine, batch.select([k for k in batch.keys() if k != keys.RESPONSE_MASK]), ppo_loss)
    with pytest.raises(ValueError, match="loss_fn must return"):
        trained(engine, batch, lambda outputs, micro_batch, n: (outputs.logprobs, {}))
    with pytest.raises(ValueError, match="max_tokens=5"):
        trained(engine, batch, ppo_loss, max_tokens=5)


def test_skipped_rows_count_in_the_normaliser_and_are_not_run(small_lm):
    batch = with_zero_advantages(make_batch(8, seed=4), [0, 3, 6])
    skip = torch.zeros(8, dtype=torch.bool)
    skip[[0, 3, 6]] = True
    seen = []

    def counting_loss(outputs, micro_batch, normalizer):
        seen.append((len(micro_batch), float(normalizer)))
        return ppo_loss(outputs, micro_batch, normalizer)

    plain, skipping = TrainingEngine(engine_config(small_lm, **EXACT)), TrainingEngine(engine_config(small_lm, **EXACT))
    expected = trained(plain, batch, ppo_loss, max_tokens=30)
    metrics = trained(skipping, batch, counting_loss, max_tokens=30, skip_rows=skip)
    assert sum(rows for rows, _ in seen) == 5
    assert {normalizer for _, normalizer in seen} == {float(batch[keys.RESPONSE_MASK].sum())}  # all 8 rows' tokens
    assert metrics["actor/rows_skipped"] == pytest.approx(3 / 8)
    assert metrics["actor/loss"] == pytest.approx(expected["actor/loss"], rel=1e-5)
    assert max_difference(parameters(skipping), parameters(plain)) < 1e-7


def test_a_mini_batch_with_every_row_skipped_still_steps_adam(small_lm):
    # zero gradients, not none: AdamW's momentum and weight decay move the weights as without skipping
    first, idle = make_batch(4, seed=5), with_zero_advantages(make_batch(4, seed=6), [0, 1, 2, 3])
    plain, skipping = TrainingEngine(engine_config(small_lm, **EXACT)), TrainingEngine(engine_config(small_lm, **EXACT))
    for engine in (plain, skipping):
        trained(engine, first, ppo_loss, micro_batch_size=2)
    after_first = parameters(plain)
    trained(plain, idle, ppo_loss, micro_batch_size=2)
    metrics = trained(skipping, idle, ppo_loss, micro_batch_size=2, skip_rows=torch.ones(4, dtype=torch.bool))
    assert metrics["actor/rows_skipped"] == 1.0 and metrics["actor/micro_batches"] == 1.0
    assert metrics["actor/grad_norm"] == 0.0 and metrics["actor/loss"] == 0.0
    assert "actor/pg_clipfrac" not in metrics  # a mean over no rows is not reported
    assert max_difference(parameters(plain), after_first) > 1e-5
    assert max_difference(parameters(skipping), parameters(plain)) < 1e-7


def test_skip_rows_must_flag_each_row(small_lm):
    engine = TrainingEngine(engine_config(small_lm))
    with pytest.raises(ValueError, match=r"skip_rows must be a bool tensor of shape \(4,\)"):
        trained(engine, make_batch(4), ppo_loss, skip_rows=torch.zeros(3, dtype=torch.bool))
