"""Packed sequences (each sample's real tokens only, several to a row) against the padded layout."""

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from posttrain.engines.training.modeling import forward_micro_batch, plain_head
from posttrain.engines.training.packing import packed_layout, padded_layout
from posttrain.protocol import Batch
from tests.engines.training.helpers import (
    batch_of,
    critic_loss,
    engine_config,
    make_batch,
    max_difference,
    packed_and_padded,
    trained,
)


def test_samples_are_packed_longest_first_each_counted_from_position_zero():
    batch = batch_of([[11, 12, 13, 14], [21], [31, 32]], [[15, 16, 17, 18], [22, 23], [33]])
    layout = packed_layout(batch)
    # Lengths 8, 3 and 3: a row as wide as the longest, the two short ones sharing the second.
    assert layout.width == 8 and layout.rows == 2 and layout.real_tokens == 14
    assert layout.inputs["input_ids"].tolist() == [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 31, 32, 33, 0, 0]]
    assert layout.inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 0, 1]]
    assert "attention_mask" not in layout.inputs
    # The output before each response token scores it: the next packed token is the label.
    flat = layout.inputs["input_ids"].reshape(-1)
    assert torch.equal(flat[layout.scored + 1], layout.labels)
    assert layout.labels.tolist() == [15, 16, 17, 18, 22, 23, 33]
    assert list(zip(layout.samples.tolist(), layout.columns.tolist())) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    # The padded layout scores the same tokens, at 3 x 8 = 24 columns for 14 real tokens.
    padded = padded_layout(batch)
    assert padded.rows * padded.width == 24 and torch.equal(padded.labels, layout.labels)
    assert torch.equal(padded.inputs["input_ids"].reshape(-1)[padded.scored + 1], padded.labels)


def test_one_row_puts_every_sample_end_to_end():
    batch = batch_of([[11, 12], [21]], [[13], [22, 23]])
    layout = packed_layout(batch, one_row=True)
    assert layout.inputs["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23]]
    assert layout.inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2]]


def test_samples_that_cannot_be_packed_are_named():
    batch = batch_of([[11, 12], [21]], [[13], [22, 23]])
    holed = Batch({**batch.tensors, keys.ATTENTION_MASK: batch[keys.ATTENTION_MASK].clone()}, batch.non_tensors, batch.meta)
    holed[keys.ATTENTION_MASK][1, -2] = 0  # a hole inside sample 1's response
    with pytest.raises(ValueError, match="sample 1's attended tokens are not one run"):
        packed_layout(holed)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_update_equals_padded_update(small_lm, dtype):
    """The issue's check: the packed path's loss and gradient norm equal the padded path's within 1e-4."""
    batch = make_batch(10, prompt_length=9, response_length=12, seed=5)
    results = packed_and_padded(small_lm, batch, dtype=dtype)
    (lp, ent, metrics, weights), (lp_pad, ent_pad, metrics_pad, weights_pad) = results[True], results[False]
    # float32: the 1e-4. bf16: other matmul shapes round differently, so a looser bound.
    tolerance, metric_tolerance = (1e-4, 1e-4) if dtype == "float32" else (2e-2, 1e-2)
    torch.testing.assert_close(lp, lp_pad, rtol=0, atol=tolerance)
    torch.testing.assert_close(ent, ent_pad, rtol=0, atol=tolerance)
    assert abs(metrics["actor/loss"] - metrics_pad["actor/loss"]) < metric_tolerance
    grad_norm = metrics_pad["actor/grad_norm"]
    assert abs(metrics["actor/grad_norm"] - grad_norm) < metric_tolerance * max(1.0, grad_norm)
    if dtype == "float32":
        assert max_difference(weights, weights_pad) < 1e-5
    padding = batch[keys.ATTENTION_MASK][:, -12:] == 0
    assert padding.any() and (lp[padding] == 0).all() and (ent[padding] == 0).all()


def test_packed_critic_equals_padded_critic(small_lm):
    batch = make_batch(7, prompt_length=6, response_length=10, seed=6)
    out = {}
    for pack in (True, False):
        engine = TrainingEngine(engine_config(small_lm, value_head=True, metric_prefix="critic", pack_sequences=pack))
        values = engine.compute_values(batch, max_tokens=40)
        metrics = trained(engine, batch, critic_loss, max_tokens=40)
        out[pack] = (values, metrics)
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=1e-5)
    assert abs(out[True][1]["critic/grad_norm"] - out[False][1]["critic/grad_norm"]) < 1e-4


def test_the_policy_forward_keeps_no_tokens_by_vocabulary_logits(small_lm):
    """Only the fused head's chunks ever hold logits: autograd saves nothing vocabulary-wide for all tokens."""
    batch = make_batch(16, prompt_length=6, response_length=12, seed=7)
    engine = TrainingEngine(engine_config(small_lm))
    scored = int((batch[keys.ATTENTION_MASK][:, -12:] != 0).sum())
    assert scored > 64  # more tokens than the head's weight has columns, so a (tokens, vocab) tensor stands out
    saved = []

    def record(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        outputs = forward_micro_batch(
            engine.module, batch, device=engine.device, dtype=torch.float32, value_head=False, with_entropy=True
        )
    (outputs.logprobs.sum() + outputs.entropy.sum()).backward()
    vocabulary_wide = [shape for shape in saved if shape[-1] == 256 and torch.Size(shape[:-1]).numel() >= scored]
    assert (scored, 64) in saved and not vocabulary_wide


def test_a_model_that_caps_its_logits_takes_its_own_head_with_the_same_results(small_lm):
    """Where the fused head would differ from the model (a logit cap), the model's own logits are used."""
    batch = make_batch(6, prompt_length=5, response_length=7, seed=8)
    fused = TrainingEngine(engine_config(small_lm))
    own = TrainingEngine(engine_config(small_lm))
    own.module.config.final_logit_softcapping = 30.0  # llama ignores it; the engine must not
    assert plain_head(fused.module) is not None and plain_head(own.module) is None
    for pack in (True, False):
        outputs = [
            forward_micro_batch(engine.module, batch, device=engine.device, dtype=torch.float32, value_head=False,
                                with_entropy=True, pack=pack)
            for engine in (fused, own)
        ]
        torch.testing.assert_close(outputs[0].logprobs, outputs[1].logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(outputs[0].entropy, outputs[1].entropy, rtol=0, atol=1e-5)
