"""compute_logprobs / compute_values against plain per-sequence references, under any split."""

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from posttrain.models import load_causal_lm
from tests.engines.training.helpers import engine_config, make_batch

SPLITS = [{}, {"micro_batch_size": 1}, {"micro_batch_size": 3}, {"max_tokens": 30}]


def _real_tokens(batch, row):
    """(prompt length, token ids) of one row without its padding."""
    mask = batch[keys.ATTENTION_MASK][row].bool()
    response_length = batch[keys.RESPONSE_IDS].shape[1]
    prompt_length = int(mask[:-response_length].sum())
    return prompt_length, batch[keys.INPUT_IDS][row][mask]


def _reference_logprobs(model, batch, temperature):
    """Each sequence alone, unpadded, through a full float32 log_softmax."""
    logprobs = torch.zeros(batch[keys.RESPONSE_IDS].shape)
    entropy = torch.zeros_like(logprobs)
    for row in range(len(batch)):
        prompt_length, ids = _real_tokens(batch, row)
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].double() / temperature
        log_softmax = torch.log_softmax(logits, dim=-1)
        for t in range(len(ids) - prompt_length):
            position = prompt_length + t - 1  # the logits that predict response token t
            logprobs[row, t] = log_softmax[position, ids[prompt_length + t]]
            entropy[row, t] = -(log_softmax[position].exp() * log_softmax[position]).sum()
    return logprobs, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_equal_a_full_log_softmax_reference(small_lm, temperature):
    batch = make_batch(6, seed=3)
    engine = TrainingEngine(engine_config(small_lm))
    expected_logprobs, expected_entropy = _reference_logprobs(load_causal_lm(small_lm), batch, temperature)
    for split in SPLITS:
        logprobs, entropy = engine.compute_logprobs(batch, temperature=temperature, with_entropy=True, **split)
        assert logprobs.dtype == torch.float32 and logprobs.shape == (6, 8)
        torch.testing.assert_close(logprobs, expected_logprobs, atol=2e-5, rtol=0, msg=f"split {split}")
        torch.testing.assert_close(entropy, expected_entropy, atol=2e-5, rtol=0, msg=f"split {split}")
    padding = batch[keys.ATTENTION_MASK][:, -8:] == 0
    assert padding.any() and (logprobs[padding] == 0).all()


def test_bf16_autocast_is_close_to_float32_but_not_equal(small_lm):
    batch = make_batch(4, seed=4)
    fp32, _ = TrainingEngine(engine_config(small_lm)).compute_logprobs(batch)
    bf16, _ = TrainingEngine(engine_config(small_lm, dtype="bfloat16")).compute_logprobs(batch)
    assert not torch.equal(fp32, bf16)
    torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0)


def test_values_read_the_state_before_each_response_token(small_lm):
    batch = make_batch(5, seed=5)
    engine = TrainingEngine(engine_config(small_lm, value_head=True, metric_prefix="critic"))
    values = engine.compute_values(batch, micro_batch_size=2)
    critic = engine.module.eval()
    for row in range(len(batch)):
        prompt_length, ids = _real_tokens(batch, row)
        with torch.no_grad():
            per_position = critic(input_ids=ids[None]).logits[0, :, 0]
        response_length = len(ids) - prompt_length
        torch.testing.assert_close(values[row, :response_length], per_position[prompt_length - 1 : -1], atol=2e-5, rtol=0)
        assert (values[row, response_length:] == 0).all()
    # The value head is drawn from init_seed, so every rank (and a rebuilt engine) starts alike.
    again = TrainingEngine(engine_config(small_lm, value_head=True)).compute_values(batch, micro_batch_size=2)
    assert torch.equal(values, again)


def test_policy_and_critic_calls_are_not_mixed_up(small_lm):
    batch = make_batch(2)
    with pytest.raises(ValueError, match="needs a critic engine"):
        TrainingEngine(engine_config(small_lm)).compute_values(batch)
    with pytest.raises(ValueError, match="temperature=0"):
        TrainingEngine(engine_config(small_lm)).compute_logprobs(batch, temperature=0)


def test_auto_dtype_is_bfloat16_only_where_the_hardware_has_it(small_lm):
    from posttrain.models import resolve_dtype

    cpu = torch.device("cpu")
    # the CPU's own flags decide, read independently of torch (Linux)
    flags = set(open("/proc/cpuinfo").read().split())
    native = bool(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if native else torch.float32)
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16 and resolve_dtype("float32", cpu) == torch.float32
    assert TrainingEngine(engine_config(small_lm, dtype="auto")).compute_dtype == resolve_dtype("auto", cpu)


def test_auto_dtype_is_float32_when_the_kernels_are_capped_at_avx2():
    """ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 make an AVX-512 machine compute as an AVX2
    one (bf16 emulated), so auto takes float32 there, as on an AVX2-only CPU."""
    import os
    import subprocess
    import sys

    code = "import torch; from posttrain.models import resolve_dtype; print(resolve_dtype('auto', torch.device('cpu')))"
    capped = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=capped, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "torch.float32"
