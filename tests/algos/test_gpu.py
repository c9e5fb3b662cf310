"""The same math on an NVIDIA GPU: CUDA results equal CPU results, and the chunked logprob keeps its
memory promise. Skipped without CUDA."""

import pytest
import torch

from posttrain.algos import (
    POLICY_LOSSES,
    apply_kl_penalty,
    entropy_from_logits,
    gae_advantages,
    get_advantage_estimator,
    AdvantageInputs,
    logprobs_from_logits,
    loss_normalizer,
    normalize_episode_rewards,
    rollout_importance_weights,
    value_loss,
)

from .helpers import random_mask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def _both(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return list(tensors), [t.cuda() for t in tensors]


def test_advantages_and_rewards_match_cpu(gen):
    rewards = torch.randn(8, 9, generator=gen)
    values = torch.randn(8, 9, generator=gen)
    mask = random_mask(8, 9, gen)
    group_ids = torch.tensor([0, 0, 0, 0, 5, 5, 5, 5])
    baseline = torch.randn(8, generator=gen)
    cpu, cuda = _both(rewards, values, mask, group_ids, baseline)
    for name in ["gae", "grpo", "drgrpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                 "remax", "grpo_passk"]:
        estimator = get_advantage_estimator(name)
        expected = estimator(AdvantageInputs(cpu[0], cpu[2], cpu[3], cpu[1], cpu[4]))
        actual = estimator(AdvantageInputs(cuda[0], cuda[2], cuda[3], cuda[1], cuda[4]))
        torch.testing.assert_close(actual.advantages.cpu(), expected.advantages, msg=name)
    torch.testing.assert_close(normalize_episode_rewards(cuda[4], "group", cuda[3]).cpu(),
                               normalize_episode_rewards(cpu[4], "group", cpu[3]))
    kl_gpu = apply_kl_penalty(cuda[0], cuda[1], cuda[4][:, None].expand(8, 9), cuda[2], beta=0.1, kind="k3")
    kl_cpu = apply_kl_penalty(cpu[0], cpu[1], cpu[4][:, None].expand(8, 9), cpu[2], beta=0.1, kind="k3")
    torch.testing.assert_close(kl_gpu.rewards.cpu(), kl_cpu.rewards)
    torch.testing.assert_close(gae_advantages(cuda[0], cuda[1], cuda[2]).returns.cpu(),
                               gae_advantages(cpu[0], cpu[1], cpu[2]).returns)


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_losses_and_gradients_match_cpu(name, gen):
    logprobs = -torch.rand(6, 7, generator=gen) * 2
    old = logprobs + torch.randn(6, 7, generator=gen) * 0.3
    behaviour = old + torch.randn(6, 7, generator=gen) * 0.1
    advantages = torch.randn(6, 7, generator=gen)
    mask = random_mask(6, 7, gen)
    results = []
    for device in ["cpu", "cuda"]:
        lp = logprobs.to(device).requires_grad_()
        weights = rollout_importance_weights(old.to(device), behaviour.to(device), mask.to(device), mode="mask").weights
        normalizer = loss_normalizer(mask.to(device), "seq-mean-token-mean") * 2  # a device tensor, as all-reduced
        out = POLICY_LOSSES[name](lp, old.to(device), advantages.to(device), mask.to(device), token_weights=weights,
                                  loss_agg_mode="seq-mean-token-mean", global_normalizer=normalizer)
        critic = value_loss(lp, old.to(device), advantages.to(device), mask.to(device)).loss
        (grad,) = torch.autograd.grad(out.loss + critic, lp)
        results.append([out.loss, out.clipfrac, out.ppo_kl, out.ppo_kl_k3, critic, grad])
    for expected, actual in zip(*results):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_chunked_logprob_and_entropy_match_cpu_in_bfloat16(gen):
    logits = (torch.randn(4, 16, 1000, generator=gen) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 1000, (4, 16), generator=gen)
    cpu_lp, cpu_h = logprobs_from_logits(logits, labels), entropy_from_logits(logits)
    gpu_lp = logprobs_from_logits(logits.cuda(), labels.cuda(), chunk_rows=7)
    gpu_h = entropy_from_logits(logits.cuda(), chunk_rows=7)
    torch.testing.assert_close(gpu_lp.cpu(), cpu_lp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gpu_h.cpu(), cpu_h, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["logprob", "entropy"])
def test_peak_memory_stays_near_the_gradient_size(which):
    # 8192 rows x 32768 vocabulary in bf16: logits 512 MiB. A plain float32 log-softmax would add
    # 1 GiB for the upcast copy and 1 GiB kept for backward; chunking keeps the extra near the
    # unavoidable bf16 gradient (512 MiB) plus a few 64 MiB chunks.
    torch.cuda.empty_cache()
    logits = torch.randn(8192, 32768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 32768, (8192,), device="cuda")
    logits_bytes = logits.numel() * logits.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    out = logprobs_from_logits(logits, labels) if which == "logprob" else entropy_from_logits(logits)
    out.sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - start
    assert extra < logits_bytes + 10 * 2**24 * 4, f"peak extra {extra / 2**20:.0f} MiB"
