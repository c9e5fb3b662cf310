"""The faster update paths (eager attention, fused AdamW, torch.compile) give the plain path's update.

Each compares two engines on the same batch for two optimizer steps, float32, with AdamW's eps = 1 so
that the step is nearly proportional to the gradient (see test_training's docstring): equal weights
then mean equal gradients. Tolerance 1e-6 on weights ~0.1 after steps of > 1e-4: a few float32 ulps
of kernel rounding, far below what a wrong gradient would give.
"""

import pytest
import torch

from posttrain.engines.training import TrainingEngine, parallel
from posttrain.engines.training.engine import _adamw
from tests.engines.training.helpers import engine_config, make_batch, max_difference, parameters, ppo_entropy_loss, trained

EXACT = {"eps": 1.0, "lr": 1e-2}


def _two_updates(engine: TrainingEngine) -> tuple[list[float], dict]:
    losses = [trained(engine, make_batch(6, seed=seed), ppo_entropy_loss, micro_batch_size=4, with_entropy=True)["actor/loss"]
              for seed in (1, 2)]
    return losses, parameters(engine)


def _assert_same_update(plain: TrainingEngine, fast: TrainingEngine) -> None:
    start = parameters(plain)
    (plain_losses, plain_after), (fast_losses, fast_after) = _two_updates(plain), _two_updates(fast)
    assert fast_losses == pytest.approx(plain_losses, abs=1e-6)
    assert max_difference(plain_after, start) > 1e-4  # the steps moved the weights
    assert max_difference(fast_after, plain_after) < 1e-6


def test_the_cpu_defaults_are_eager_attention_and_fused_adamw(small_lm):
    engine = TrainingEngine(engine_config(small_lm))
    assert engine.module.config._attn_implementation == "eager"
    assert engine.optimizer.defaults["fused"] is True


def test_eager_attention_gives_the_sdpa_update(small_lm):
    _assert_same_update(TrainingEngine(engine_config(small_lm, attn_implementation="sdpa", **EXACT)),
                        TrainingEngine(engine_config(small_lm, attn_implementation="eager", **EXACT)))


def test_fused_adamw_steps_like_the_per_parameter_loop():
    torch.manual_seed(0)
    weights = [torch.randn(5, 7) for _ in range(3)]
    grads = [torch.randn(5, 7) for _ in range(3)]
    config = engine_config("unused", weight_decay=0.1, eps=1e-8)
    results = []
    for make in (lambda ps: _adamw(ps, config), lambda ps: torch.optim.AdamW(ps, lr=config.lr, weight_decay=0.1, foreach=False)):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        optimizer = make(params)
        for _ in range(3):
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            optimizer.step()
        results.append(params)
    fused, loop = results
    assert fused[0].data.sub(weights[0]).abs().max() > 1e-3  # lr 1e-3, three steps of ~lr each
    for a, b in zip(fused, loop):
        torch.testing.assert_close(a.data, b.data, atol=1e-6, rtol=0)


def test_a_compiled_model_gives_the_eager_update(small_lm):
    # Compiles a 2-layer model's decoder layer for two micro-batch shapes, forward and backward.
    compiled = TrainingEngine(engine_config(small_lm, compile=True, **EXACT))
    layers = parallel.decoder_layers(compiled.module)
    assert len(layers) == compiled.module.config.num_hidden_layers
    assert all(layer._compiled_call_impl is not None for layer in layers)  # each layer, not the whole model
    assert compiled.module._compiled_call_impl is None
    _assert_same_update(TrainingEngine(engine_config(small_lm, **EXACT)), compiled)
