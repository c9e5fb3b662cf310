"""A group's prompt computed once (packing.shared_prompt_layout): laid out as written, and exact.

Exactness is against the packed layout (each sample with its own copy of the prompt), float32 on a
tiny model: per-token log-probs to 1e-5, gradients to 1e-4 relative, for single-turn and multi-turn
batches, the policy (GRPO/PPO losses with entropy) and the critic.
"""

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from posttrain.engines.training.inputs import prompt_groups
from posttrain.engines.training.micro_batches import split_units_by_token_budget
from posttrain.engines.training.modeling import forward_micro_batch, model_shared_prompt_problem
from posttrain.engines.training.packing import shared_prompt_layout
from tests.engines.training.helpers import batch_of, engine_config, grouped_batch, parameters, ppo_entropy_loss, trained


def test_a_group_is_its_prompt_once_then_each_response_continuing_its_positions():
    # Samples 0 and 2 share prompt [11, 12, 13]; sample 1 has a prompt of its own.
    batch = batch_of([[11, 12, 13], [21], [11, 12, 13]], [[14, 15], [22, 23], [16]])
    assert prompt_groups(batch).tolist() == [0, 1, 0]
    layout = shared_prompt_layout(batch)
    # Units: [11 12 13 | 14 15 | 16] (6 tokens) and [21 | 22 23] (3): rows as wide as the longest unit.
    assert layout.width == 6 and layout.rows == 2 and layout.real_tokens == 9
    assert layout.inputs["input_ids"].tolist() == [[11, 12, 13, 14, 15, 16], [21, 22, 23, 0, 0, 0]]
    assert layout.inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 0, 0, 0]]
    seen = layout.inputs["attention_mask"][:, 0].int().tolist()
    assert seen[0] == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],  # the second response sees the prompt and itself, not the first response
    ]
    assert [row[:3] for row in seen[1][:3]] == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert [row[3:] for row in seen[1][3:]] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]  # filler: each token alone
    # Each response's first token is scored by the prompt's last output (flat index 2), the rest by the token before.
    flat = layout.inputs["input_ids"].reshape(-1)
    scored = dict(zip(zip(layout.samples.tolist(), layout.columns.tolist()), layout.scored.tolist()))
    assert scored == {(0, 0): 2, (0, 1): 3, (1, 0): 6, (1, 1): 7, (2, 0): 2}
    assert layout.labels.tolist() == [14, 15, 22, 23, 16] and flat[7 + 1] == 23


def test_an_additive_mask_for_eager_attention():
    batch = batch_of([[11, 12], [11, 12]], [[13], [14]])
    mask = shared_prompt_layout(batch, mask_dtype=torch.float32).inputs["attention_mask"][0, 0]
    allowed = shared_prompt_layout(batch).inputs["attention_mask"][0, 0]
    assert torch.equal(mask == 0, allowed) and (mask[~allowed] == torch.finfo(torch.float32).min).all()


def test_no_shared_prompt_is_the_packed_layout():
    batch = batch_of([[11, 12], [21]], [[13], [22, 23]])
    layout = shared_prompt_layout(batch)
    assert "attention_mask" not in layout.inputs and layout.inputs["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]]


def _forward_and_gradients(model_dir, batch, *, share: bool, value_head: bool = False, attn: str = "eager"):
    engine = TrainingEngine(engine_config(model_dir, share_prompt=share, value_head=value_head,
                                          metric_prefix="critic" if value_head else "actor", attn_implementation=attn))
    outputs = forward_micro_batch(engine.module, batch, device=torch.device("cpu"), dtype=torch.float32,
                                  value_head=value_head, with_entropy=not value_head, share_prompt=share)
    mask = batch[keys.RESPONSE_MASK]
    if value_head:
        loss = ((outputs.values - batch[keys.RETURNS]) ** 2 * mask).sum()
        result = outputs.values
    else:  # a policy-gradient surrogate plus the entropy: every token's log-prob and entropy get a gradient
        loss = -(outputs.logprobs * batch[keys.ADVANTAGES] * mask).sum() - 0.1 * (outputs.entropy * mask).sum()
        result = outputs.logprobs
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in engine.module.named_parameters() if p.grad is not None}
    return result.detach(), gradients


def _assert_gradients_close(shared: dict, packed: dict) -> None:
    assert shared.keys() == packed.keys() and shared
    for name in packed:
        relative = (shared[name] - packed[name]).norm() / packed[name].norm().clamp_min(1e-12)
        assert relative < 1e-4, f"{name}: relative gradient difference {relative:.2e}"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("multi_turn", [False, True], ids=["single_turn", "multi_turn"])
def test_policy_logprobs_and_gradients_equal_the_packed_path(small_lm, attn, multi_turn):
    batch = grouped_batch(3, 4, seed=1, observation_holes=multi_turn)
    logprobs, gradients = _forward_and_gradients(small_lm, batch, share=True, attn=attn)
    packed_logprobs, packed_gradients = _forward_and_gradients(small_lm, batch, share=False, attn=attn)
    torch.testing.assert_close(logprobs, packed_logprobs, rtol=0, atol=1e-5)
    _assert_gradients_close(gradients, packed_gradients)


def test_critic_values_and_gradients_equal_the_packed_path(small_lm):
    batch = grouped_batch(2, 4, seed=2)
    values, gradients = _forward_and_gradients(small_lm, batch, share=True, value_head=True)
    packed_values, packed_gradients = _forward_and_gradients(small_lm, batch, share=False, value_head=True)
    torch.testing.assert_close(values, packed_values, rtol=0, atol=1e-5)
    _assert_gradients_close(gradients, packed_gradients)


@pytest.mark.parametrize("micro, lora", [({"max_tokens": 40}, 0), ({"micro_batch_size": 3}, 0), ({"max_tokens": 40}, 4)],
                         ids=["token_budget", "count", "token_budget_lora"])
def test_an_update_equals_the_packed_path_whatever_the_micro_batches(small_lm, micro, lora):
    """Whole updates through the engine (groups cut across micro-batches, a group over the budget
    split with its prompt repeated; full weights or LoRA): the same metrics and the same weights after."""
    batch = grouped_batch(3, 4, seed=3)
    results = {}
    for share in (True, False):
        engine = TrainingEngine(engine_config(small_lm, share_prompt=share, lora_rank=lora))
        metrics = trained(engine, batch, ppo_entropy_loss, with_entropy=True, **micro)
        results[share] = metrics, parameters(engine)
    (metrics, weights), (packed_metrics, packed_weights) = results[True], results[False]
    assert abs(metrics["actor/loss"] - packed_metrics["actor/loss"]) < 1e-5
    assert abs(metrics["actor/grad_norm"] - packed_metrics["actor/grad_norm"]) < 1e-4 * packed_metrics["actor/grad_norm"]
    assert max((weights[k] - packed_weights[k]).abs().max().item() for k in weights) < 1e-5


def test_units_are_packed_by_the_tokens_they_compute_and_split_over_the_budget():
    # Two groups: prompt 10 with responses 5, 5, 5 (25 tokens computed) and prompt 4 with 2, 2 (8).
    prompts, responses, units = [10, 10, 10, 4, 4], [5, 5, 5, 2, 2], [0, 0, 0, 1, 1]
    assert split_units_by_token_budget(prompts, responses, units, 33) == [[0, 1, 2, 3, 4]]  # 25 + 8
    # A budget of 24: group 0 is cut in two pieces, each paying its prompt (10 + 5 + 5, 10 + 5), and the
    # second shares a micro-batch with group 1 (15 + 8).
    pieces = split_units_by_token_budget(prompts, responses, units, 24)
    assert sorted(map(sorted, pieces)) == [[0, 1], [2, 3, 4]]
    with pytest.raises(ValueError, match="more than the micro-batch token budget"):
        split_units_by_token_budget(prompts, responses, units, 14)


def test_a_model_whose_attention_cannot_take_the_mask_is_refused(small_lm):
    engine = TrainingEngine(engine_config(small_lm))
    assert engine.share_prompt and model_shared_prompt_problem(engine.module) is None
    engine.module.config.sliding_window = 16
    assert "other than full causal ones (sliding_window)" in model_shared_prompt_problem(engine.module)
    engine.module.config.sliding_window = None
    engine.module.config._attn_implementation = "flash_attention_2"
    assert "needs eager or sdpa" in model_shared_prompt_problem(engine.module)
