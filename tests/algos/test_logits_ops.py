import math

import pytest
import torch

from posttrain.algos import entropy_from_logits, head_logprobs, logprobs_from_logits


def _loop_logprob(row: list[float], label: int) -> float:
    log_norm = math.log(sum(math.exp(z) for z in row))
    return row[label] - log_norm


def _loop_entropy(row: list[float]) -> float:
    norm = sum(math.exp(z) for z in row)
    probs = [math.exp(z) / norm for z in row]
    return -sum(p * math.log(p) for p in probs if p > 0)


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 3, 7), (3, 5, 11)])
@pytest.mark.parametrize("chunk_rows", [1, 4, None])
def test_values_match_loops(shape, chunk_rows, gen):
    logits = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    logprobs = logprobs_from_logits(logits, labels, chunk_rows=chunk_rows)
    entropy = entropy_from_logits(logits, chunk_rows=chunk_rows)
    assert logprobs.shape == entropy.shape == shape[:-1]
    for index in torch.cartesian_prod(*[torch.arange(n) for n in shape[:-1]]).reshape(-1, len(shape) - 1):
        position = tuple(index.tolist())
        row = logits[position].tolist()
        assert logprobs[position].item() == pytest.approx(_loop_logprob(row, int(labels[position])), abs=1e-5)
        assert entropy[position].item() == pytest.approx(_loop_entropy(row), abs=1e-5)


@pytest.mark.parametrize("chunk_rows", [1, 3, None])
def test_gradients_match_autograd_through_log_softmax(chunk_rows, gen):
    logits = torch.randn(2, 5, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 9, (2, 5), generator=gen)
    weights = torch.randn(2, 5, generator=gen, dtype=torch.float64)
    ours = (logprobs_from_logits(logits, labels, chunk_rows=chunk_rows) * weights).sum()
    ours = ours + (entropy_from_logits(logits, chunk_rows=chunk_rows) * weights.flip(0)).sum()
    (grad_ours,) = torch.autograd.grad(ours, logits)
    log_probs = torch.log_softmax(logits, dim=-1)
    reference = (log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * weights).sum()
    reference = reference + (-(log_probs.exp() * log_probs).sum(-1) * weights.flip(0)).sum()
    (grad_reference,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(grad_ours, grad_reference)


def test_hand_worked_two_token_vocabulary():
    # logits (0, ln 3): p = (1/4, 3/4); log p(1) = ln 3 - ln 4 = -0.287682
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert logprobs_from_logits(logits, torch.tensor([1])).item() == pytest.approx(-0.287682, abs=1e-6)
    assert entropy_from_logits(logits).item() == pytest.approx(0.562335, abs=1e-6)


def test_bfloat16_logits_compute_in_float32_and_keep_gradient_dtype(gen):
    logits = (torch.randn(4, 50, generator=gen) * 4).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 50, (4,), generator=gen)
    logprobs = logprobs_from_logits(logits, labels, chunk_rows=2)
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.detach().float(), -1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)
    logprobs.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_masked_vocabulary_entries_give_finite_entropy_and_gradient():
    # Two live entries of equal logit: H = ln 2, and the -inf entries contribute nothing.
    logits = torch.tensor([[1.0, float("-inf"), 1.0, float("-inf")]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert entropy.item() == pytest.approx(math.log(2.0))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_label_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"labels shape \(2, 4\).*logits shape \(2, 3, 5\)"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_autograd_saves_no_float32_copy_of_the_logits(gen):
    # The memory promise: for backward only the bf16 logits themselves (plus per-row vectors) are
    # kept, not a float32 (N, V) log-softmax as autograd through torch.log_softmax would keep.
    logits = torch.randn(6, 40, generator=gen).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 40, (6,), generator=gen)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logprobs_from_logits(logits, labels, chunk_rows=2)
        entropy_from_logits(logits, chunk_rows=2)
    large = [t for t in saved if t.numel() >= logits.numel()]
    assert large and all(t.dtype == torch.bfloat16 and t.data_ptr() == logits.data_ptr() for t in large)


# ---- head_logprobs: the LM head fused with the log-softmax --------------------------------------------


def _head_reference(hidden, weight, labels, temperature):
    logits = hidden @ weight.T / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, labels[:, None])[:, 0], -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("chunk_rows", [1, 4, None])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_head_logprobs_values_and_gradients_equal_full_logits(chunk_rows, temperature, gen):
    hidden = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 13, (9,), generator=gen)
    logprobs, entropy = head_logprobs(hidden, weight, labels, temperature=temperature, with_entropy=True, chunk_rows=chunk_rows)
    expected_logprobs, expected_entropy = _head_reference(hidden, weight, labels, temperature)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    a, b = torch.randn(9, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad((logprobs * a).sum() + (entropy * b).sum(), (hidden, weight))
    want = torch.autograd.grad((expected_logprobs * a).sum() + (expected_entropy * b).sum(), (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    # Without entropy, only the logprob's gradient.
    logprobs, none = head_logprobs(hidden, weight, labels, temperature=temperature, chunk_rows=chunk_rows)
    assert none is None
    got = torch.autograd.grad((logprobs * a).sum(), (hidden, weight))
    want = torch.autograd.grad((_head_reference(hidden, weight, labels, temperature)[0] * a).sum(), (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_head_logprobs_backward_with_a_frozen_head_and_with_no_rows(gen):
    hidden = torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    frozen = torch.randn(13, 6, generator=gen, dtype=torch.float64)  # LoRA: the head does not train
    labels = torch.randint(0, 13, (5,), generator=gen)
    head_logprobs(hidden, frozen, labels)[0].sum().backward()
    expected = torch.autograd.grad(_head_reference(hidden, frozen, labels, 1.0)[0].sum(), hidden)[0]
    torch.testing.assert_close(hidden.grad, expected, rtol=0, atol=1e-10)
    assert frozen.grad is None
    # a micro-batch with no scored token (a padding micro-batch of a rank with fewer samples)
    weight = frozen.clone().requires_grad_()
    none = torch.zeros(0, 6, dtype=torch.float64, requires_grad=True)
    head_logprobs(none, weight, labels[:0])[0].sum().backward()
    assert weight.grad is not None and (weight.grad == 0).all() and none.grad.shape == (0, 6)


def test_head_logprobs_keeps_no_logits_for_backward(gen):
    hidden = torch.randn(40, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen, requires_grad=True)
    labels = torch.randint(0, 50, (40,), generator=gen)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        logprobs, entropy = head_logprobs(hidden, weight, labels, with_entropy=True, chunk_rows=8)
    (logprobs.sum() + entropy.sum()).backward()
    assert (40, 8) in saved and (50, 8) in saved  # the inputs are what it keeps
    assert not [shape for shape in saved if shape[-1] == 50 and len(shape) == 2 and shape[0] > 8]
    # The plain path keeps the (40, 50) logits.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        logprobs_from_logits(hidden @ weight.T, labels)
    assert (40, 50) in saved


def test_head_logprobs_in_bfloat16_is_close_to_float32_with_float32_gradients(gen):
    hidden = torch.randn(12, 16, generator=gen, requires_grad=True)
    weight = torch.randn(30, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 30, (12,), generator=gen)
    fp32, _ = head_logprobs(hidden, weight, labels)
    bf16, _ = head_logprobs(hidden, weight, labels, compute_dtype=torch.bfloat16)
    assert fp32.dtype == bf16.dtype == torch.float32 and not torch.equal(fp32, bf16)
    torch.testing.assert_close(bf16, fp32, rtol=0, atol=0.5)
    bf16.sum().backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32


def test_head_logprobs_refuses_mismatched_shapes(gen):
    with pytest.raises(ValueError, match="same H"):
        head_logprobs(torch.zeros(3, 4), torch.zeros(5, 6), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="one per hidden row"):
        head_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))
