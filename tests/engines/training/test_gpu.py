"""The engine's GPU paths: FSDP2 over NCCL, CPU offload, bf16, checkpoints and exports of sharded weights.

Skipped without CUDA. NCCL refuses two ranks on one device, so on a one-GPU machine the process
group has one rank (a world-size-1 mesh: the sharding code runs, the shards are whole); the
two-rank sharding logic is covered on CPU by test_distributed.py (FSDP2 over gloo).
Tolerances: parameters to 1e-6 between FSDP2 and a plain model (float32 on the GPU; eps = 1, see
test_training.py), logprobs to 2e-4 between the GPU and a float32 engine on the CPU.
"""

from datetime import timedelta

import pytest
import torch

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from tests.engines.training.helpers import (
    counting_fused_head,
    engine_config,
    grouped_batch,
    make_batch,
    max_difference,
    packed_and_padded,
    parameters,
    ppo_entropy_loss,
    ppo_loss,
    trained,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

EXACT = {"eps": 1.0, "lr": 1e-2, "grad_clip": None, "device": "cuda", "dtype": "float32"}


@pytest.fixture(scope="module", autouse=True)
def nccl_group(tmp_path_factory):
    import torch.distributed as dist

    store = f"file://{tmp_path_factory.mktemp('nccl') / 'rendezvous'}"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=store, rank=0, world_size=1, timeout=timedelta(seconds=120))
    yield
    dist.destroy_process_group()


def _local_device(engine) -> torch.device:
    from torch.distributed.tensor import DTensor

    weight = engine.module.model.layers[0].mlp.up_proj.weight
    assert isinstance(weight, DTensor), "FSDP2 did not shard the decoder layer"
    return weight.to_local().device


def test_fsdp2_on_nccl_equals_a_plain_model_on_the_gpu(small_lm):
    batch = make_batch(8, seed=1)
    sharded = TrainingEngine(engine_config(small_lm, **EXACT))
    assert sharded.strategy == "fsdp" and _local_device(sharded).type == "cuda"
    plain = TrainingEngine(engine_config(small_lm, strategy="none", **EXACT))
    sharded_metrics = trained(sharded, batch, ppo_loss, micro_batch_size=3)
    plain_metrics = trained(plain, batch, ppo_loss, max_tokens=40)
    assert sharded_metrics["actor/grad_norm"] == pytest.approx(plain_metrics["actor/grad_norm"], rel=1e-4)
    assert max_difference(parameters(sharded), parameters(plain)) < 1e-6


def test_cpu_offload_keeps_shards_on_the_cpu_and_gives_the_same_update(small_lm):
    batch = make_batch(8, seed=2)
    offloaded = TrainingEngine(engine_config(small_lm, cpu_offload=True, **EXACT))
    assert _local_device(offloaded).type == "cpu"
    on_gpu = TrainingEngine(engine_config(small_lm, **EXACT))
    for engine in (offloaded, on_gpu):
        trained(engine, batch, ppo_loss, micro_batch_size=4)
    assert max_difference(parameters(offloaded), parameters(on_gpu)) < 1e-6


def test_gpu_logprobs_are_close_to_the_cpu_engine(small_lm):
    batch = make_batch(6, seed=3)
    reference, _ = TrainingEngine(engine_config(small_lm)).compute_logprobs(batch)  # float32 CPU
    gpu_fp32, _ = TrainingEngine(engine_config(small_lm, device="cuda", dtype="float32")).compute_logprobs(batch)
    gpu_bf16, _ = TrainingEngine(engine_config(small_lm, device="cuda", dtype="bfloat16")).compute_logprobs(batch)
    torch.testing.assert_close(gpu_fp32, reference, atol=2e-4, rtol=0)
    torch.testing.assert_close(gpu_bf16, reference, atol=0.1, rtol=0)
    assert gpu_bf16.device.type == "cpu" and gpu_bf16.dtype == torch.float32


def test_bf16_training_on_fsdp2_stays_finite_and_learns(small_lm):
    batch = make_batch(8, seed=4)
    engine = TrainingEngine(engine_config(small_lm, device="cuda", dtype="bfloat16", lr=1e-3))
    before, _ = engine.compute_logprobs(batch)
    for _ in range(3):
        metrics = trained(engine, batch, ppo_loss, micro_batch_size=4)
        assert metrics["actor/skipped"] == 0.0
    after, _ = engine.compute_logprobs(batch)
    assert torch.isfinite(after).all() and not torch.equal(before, after)


def test_checkpoint_round_trip_under_fsdp2(small_lm, tmp_path):
    config = engine_config(small_lm, warmup_steps=2, **EXACT)
    original = TrainingEngine(config)
    trained(original, make_batch(4, seed=5), ppo_loss)
    original.save_checkpoint(tmp_path)
    expected = trained(original, make_batch(4, seed=6), ppo_loss)
    resumed = TrainingEngine(config)
    resumed.load_checkpoint(tmp_path)
    metrics = trained(resumed, make_batch(4, seed=6), ppo_loss)
    assert metrics["actor/lr"] == expected["actor/lr"]
    assert max_difference(parameters(resumed), parameters(original)) < 1e-6


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_export_of_sharded_weights_reloads_with_the_same_logprobs(small_lm, tmp_path, lora_rank):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm, lora_rank=lora_rank, **EXACT))
    batch = make_batch(4, seed=7)
    for _ in range(2):
        trained(engine, batch, ppo_loss)
    engine.export_hf(tmp_path)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert max_difference(dict(exported.state_dict()), parameters(engine)) < 1e-6
    on_cpu, _ = TrainingEngine(engine_config(tmp_path)).compute_logprobs(batch)
    on_gpu, _ = engine.compute_logprobs(batch)
    torch.testing.assert_close(on_gpu, on_cpu, atol=2e-4, rtol=0)


@pytest.mark.parametrize("strategy", ["fsdp", "none"])
def test_packed_update_equals_padded_on_the_gpu(small_lm, strategy):
    """Packed rows on CUDA (sdpa, each sample masked by its position ids) give the padded path's results.

    Both take the fused head: under FSDP2 it reads the head's weight gathered by the root's forward.
    """
    batch = make_batch(10, prompt_length=9, response_length=12, seed=9)
    with counting_fused_head() as fused_calls:
        results = packed_and_padded(small_lm, batch, strategy=strategy, **EXACT)
    assert fused_calls, "the update did not take the fused head"
    (lp, ent, metrics, weights), (lp_pad, ent_pad, metrics_pad, weights_pad) = results[True], results[False]
    torch.testing.assert_close(lp, lp_pad, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent, ent_pad, rtol=0, atol=1e-4)
    assert abs(metrics["actor/loss"] - metrics_pad["actor/loss"]) < 1e-4
    assert abs(metrics["actor/grad_norm"] - metrics_pad["actor/grad_norm"]) < 1e-4 * max(1.0, metrics_pad["actor/grad_norm"])
    assert max_difference(weights, weights_pad) < 1e-5
    padding = batch[keys.ATTENTION_MASK][:, -12:] == 0
    assert padding.any() and (lp[padding] == 0).all()


@pytest.mark.parametrize("strategy", ["fsdp", "none"])
def test_a_shared_prompt_update_equals_the_packed_one_on_the_gpu(small_lm, strategy, monkeypatch):
    """A group's prompt computed once on CUDA: sdpa takes the layout's explicit boolean 4D mask (CUDA's
    kernels, not the CPU's), with FSDP2 and without; log-probs, entropy-bearing update and weights as
    the packed layout's (each sample with its own copy of the prompt), and nothing NaN."""
    from posttrain.engines.training import modeling

    layouts = []
    real_layout = modeling.shared_prompt_layout
    monkeypatch.setattr(modeling, "shared_prompt_layout", lambda *a, **k: layouts.append(k) or real_layout(*a, **k))
    batch = grouped_batch(3, 4, seed=3)
    results = {}
    for share in (True, False):
        engine = TrainingEngine(engine_config(small_lm, share_prompt=share, strategy=strategy, **EXACT))
        assert engine.share_prompt == share and engine.device.type == "cuda"
        logprobs, _ = engine.compute_logprobs(batch)
        metrics = trained(engine, batch, ppo_entropy_loss, with_entropy=True, max_tokens=40)
        results[share] = logprobs, metrics, parameters(engine)
    assert layouts, "the update did not take the shared-prompt layout"
    assert all(k.get("mask_dtype") == torch.bool for k in layouts), "the layout's mask is not sdpa's boolean one"
    (lp, metrics, weights), (lp_packed, metrics_packed, weights_packed) = results[True], results[False]
    assert torch.isfinite(lp).all() and torch.isfinite(torch.tensor(metrics["actor/loss"]))
    torch.testing.assert_close(lp, lp_packed, rtol=0, atol=1e-5)
    assert abs(metrics["actor/loss"] - metrics_packed["actor/loss"]) < 1e-5
    grad_norm = metrics_packed["actor/grad_norm"]
    assert abs(metrics["actor/grad_norm"] - grad_norm) < 1e-4 * grad_norm
    assert max_difference(weights, weights_packed) < 1e-5
