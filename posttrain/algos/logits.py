"""Log-probability of chosen tokens and entropy of the next-token distribution, from logits.

    logprobs_from_logits(logits, labels)  # (..., V), (...) -> (...) float32*
    entropy_from_logits(logits)           # (..., V) -> (...) float32*
    (* float64 for float64 logits; bf16 and fp16 logits are computed in float32)
    head_logprobs(hidden, weight, labels) # (N, H), (V, H), (N,) -> (N,) float32, and (N,) entropy or None

    log pi(y) = z_y - logsumexp(z)
    H(pi)     = -sum_i p_i log p_i,  p = softmax(z)   (p_i log p_i taken as 0 where z_i = -inf)

Memory. A float32 log-softmax over a (B * T, V) batch with a 150k vocabulary is several GiB, and
autograd would keep it for the backward pass. Both functions therefore work on row chunks: the
forward pass upcasts one chunk of rows to float32 at a time, and the backward pass recomputes the
softmax chunk by chunk instead of storing it (a custom autograd function). The only full-size
allocation is the gradient of the logits itself, in the logits' own dtype. Chunks hold about
`_CHUNK_ELEMENTS` float32 values unless `chunk_rows` says otherwise: 64 MiB on a GPU, where big
kernels keep it busy, and 4 MiB on a CPU, where a chunk that stays in cache made logprobs, entropy
and the backward pass 4x faster than 64 MiB chunks (784 rows of a 49k vocabulary, bf16 logits). Double backward is not
supported (no loss in this package needs it). A non-contiguous `logits` (e.g. `logits[:, :-1]`) is
copied once by the flattening reshape; slice the hidden states before the LM head to avoid it.
Sampling temperature is the caller's: divide the logits before calling.

The LM head fused in (`head_logprobs`). Given the final hidden states of the N positions that are
scored and the head's weight, the logits are made one row chunk at a time (z = h W^T / temperature),
used for the logprob and the entropy (the softmax in cache-sized pieces, as above), and dropped;
the backward pass makes them again from h and W.
So neither the (N, V) logits nor their gradient ever exist, only one chunk of each. The matmuls run
in `compute_dtype` (the autocast dtype: bf16 inputs give bf16 logits, upcast for the softmax, as
autocast would); the weight's gradient is summed over chunks in float32. A chunk holds 2^26 logits
(1365 rows of a 49k vocabulary; 128 MiB in bf16): the weight's gradient is read and written once
per chunk, so much smaller chunks would spend the time moving it. The price of never keeping the
logits is one more head matmul in the backward pass (4 instead of 3).

Gradients, used by the backward passes (p = softmax(z), g the incoming gradient):
    d log pi(y) / dz_i = 1[i = y] - p_i
    d H / dz_i         = -p_i * (log p_i + H)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

__all__ = ["logprobs_from_logits", "entropy_from_logits", "head_logprobs"]

# float32 values per chunk, by device type (module docstring); 64 MiB is small next to a model.
_CHUNK_ELEMENTS = {"cpu": 2**20}
_DEFAULT_CHUNK_ELEMENTS = 2**24
_HEAD_CHUNK_ELEMENTS = 2**26  # head_logprobs's matmul chunks, on every device (module docstring)


def _rows_per_chunk(logits: Tensor, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        return chunk_rows
    elements = _CHUNK_ELEMENTS.get(logits.device.type, _DEFAULT_CHUNK_ELEMENTS)
    return max(1, elements // max(logits.shape[-1], 1))


def _compute_dtype(logits: Tensor) -> torch.dtype:
    # bf16/fp16 logits are upcast (their log-softmax loses too much); float64 stays float64.
    return torch.promote_types(logits.dtype, torch.float32)


def _chunks(num_rows: int, rows: int) -> list[slice]:
    return [slice(start, min(start + rows, num_rows)) for start in range(0, num_rows, rows)]


class _ChunkedTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, logits: Tensor, labels: Tensor, rows: int) -> Tensor:  # (N, V), (N,) -> (N,)
        ctx.compute_dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=ctx.compute_dtype, device=logits.device)
        for part in _chunks(logits.shape[0], rows):
            # log_softmax then gather: on CPU ~1.6x faster than logsumexp for a 49k vocabulary,
            # and no larger (both make one chunk-sized temporary).
            chunk = torch.log_softmax(logits[part].to(ctx.compute_dtype), dim=-1)
            out[part] = chunk.gather(-1, labels[part].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, labels)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, labels = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for part in _chunks(logits.shape[0], ctx.rows):
            g = grad_out[part].to(ctx.compute_dtype).unsqueeze(-1)
            chunk_grad = torch.softmax(logits[part].to(ctx.compute_dtype), dim=-1).mul_(-g)
            chunk_grad.scatter_add_(-1, labels[part].unsqueeze(-1), g)
            grad[part] = chunk_grad.to(grad.dtype)
        return grad, None, None


def _finite_log_softmax(chunk: Tensor) -> Tensor:
    # Logits of -inf (a vocabulary masked by top-k, say) give p = 0 and log p = -inf, and 0 * -inf
    # is NaN where the limit of p log p is 0. Clamping log p to the dtype's lowest finite value
    # keeps p * log p = 0 there without a second full-size mask.
    return torch.log_softmax(chunk, dim=-1).clamp_(min=torch.finfo(chunk.dtype).min)


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, logits: Tensor, rows: int) -> Tensor:  # (N, V) -> (N,)
        ctx.compute_dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=ctx.compute_dtype, device=logits.device)
        for part in _chunks(logits.shape[0], rows):
            log_probs = _finite_log_softmax(logits[part].to(ctx.compute_dtype))
            out[part] = -(log_probs.exp() * log_probs).sum(dim=-1)
        ctx.save_for_backward(logits, out)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, None]:
        logits, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for part in _chunks(logits.shape[0], ctx.rows):
            log_probs = _finite_log_softmax(logits[part].to(ctx.compute_dtype))
            probs = log_probs.exp()
            # -p * (log p + H) * g, in place to hold at most two chunk-sized buffers.
            log_probs.add_(entropy[part].unsqueeze(-1)).mul_(probs)
            log_probs.mul_(-grad_out[part].to(ctx.compute_dtype).unsqueeze(-1))
            grad[part] = log_probs.to(grad.dtype)
        return grad, None


def logprobs_from_logits(logits: Tensor, labels: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Log-probability of `labels` under softmax(`logits`).  # (..., V), (...) -> (...) float32*

    `labels` must be an integer tensor shaped like `logits` without its last dimension.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape {tuple(logits.shape)} "
            "without its last (vocabulary) dimension"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(logits, chunk_rows)
    flat = _ChunkedTokenLogprob.apply(flat_logits, labels.reshape(-1).long(), rows)
    return flat.reshape(labels.shape)


def entropy_from_logits(logits: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Entropy (nats) of softmax(`logits`) over the last dimension.  # (..., V) -> (...) float32*"""
    flat_logits = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(logits, chunk_rows)
    return _ChunkedEntropy.apply(flat_logits, rows).reshape(logits.shape[:-1])


class _ChunkedHeadLogprob(torch.autograd.Function):
    # Two chunk sizes: `rows` rows of logits per matmul (big enough that W's gradient is read and
    # written rarely), and within them `sub_rows` rows per softmax step (cache-sized on a CPU, as
    # logprobs_from_logits's chunks).
    @staticmethod
    def forward(  # (N, H), (V, H), (N,) -> (N,), (N,)
        ctx: FunctionCtx, hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float,
        with_entropy: bool, rows: int, sub_rows: int, compute_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        softmax_dtype = torch.promote_types(compute_dtype, torch.float32)
        logprobs = torch.empty(h.shape[0], dtype=softmax_dtype, device=h.device)
        logsumexp = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else logprobs.new_zeros(0)
        for part in _chunks(h.shape[0], rows):
            logits = h[part] @ w.T
            for sub in _chunks(logits.shape[0], sub_rows):
                rows_at = slice(part.start + sub.start, part.start + sub.stop)
                z = logits[sub].to(softmax_dtype).div_(temperature)
                log_probs = torch.log_softmax(z, dim=-1)
                chosen = labels[rows_at].unsqueeze(-1)
                logprobs[rows_at] = log_probs.gather(-1, chosen).squeeze(-1)
                logsumexp[rows_at] = z.gather(-1, chosen).squeeze(-1) - logprobs[rows_at]
                if with_entropy:
                    entropy[rows_at] = -(log_probs.exp() * log_probs).sum(dim=-1)
        # The weight in the compute dtype is kept (V x H, far smaller than the logits) rather than cast again.
        ctx.save_for_backward(h, w, labels, logsumexp, entropy)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.settings = (temperature, with_entropy, rows, sub_rows, compute_dtype, softmax_dtype)
        ctx.mark_non_differentiable(logsumexp)
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):
        h, w, labels, logsumexp, entropy = ctx.saved_tensors
        temperature, with_entropy, rows, sub_rows, compute_dtype, softmax_dtype = ctx.settings
        hidden_dtype, weight_dtype = ctx.dtypes
        grad_hidden = torch.empty(h.shape, dtype=hidden_dtype, device=h.device)
        # float32 (float64 for float64) sum over chunks; none for a frozen head (LoRA)
        wants_weight = ctx.needs_input_grad[1]
        grad_weight = torch.zeros(w.shape, dtype=torch.promote_types(w.dtype, torch.float32), device=w.device) if wants_weight else None
        for part in _chunks(h.shape[0], rows):
            logits = h[part] @ w.T
            grad_logits = torch.empty_like(logits)
            for sub in _chunks(logits.shape[0], sub_rows):
                rows_at = slice(part.start + sub.start, part.start + sub.stop)
                log_probs = logits[sub].to(softmax_dtype).div_(temperature).sub_(logsumexp[rows_at].unsqueeze(-1))
                probs = log_probs.exp()
                # dz = g_lp * (onehot(y) - p) + g_H * (-p * (log p + H)), then / temperature.
                if grad_logprobs is not None:
                    g = grad_logprobs[rows_at].to(softmax_dtype).unsqueeze(-1)
                    grad_z = (probs * -g).scatter_add_(-1, labels[rows_at].unsqueeze(-1), g)
                else:
                    grad_z = torch.zeros_like(probs)
                if with_entropy and grad_entropy is not None:
                    g = grad_entropy[rows_at].to(softmax_dtype).unsqueeze(-1)
                    grad_z.sub_(log_probs.add_(entropy[rows_at].unsqueeze(-1)).mul_(probs).mul_(g))
                grad_logits[sub] = grad_z.div_(temperature).to(compute_dtype)
            grad_hidden[part] = grad_logits @ w
            if wants_weight:
                grad_weight += grad_logits.T @ h[part]
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight_dtype), None, None, None, None, None, None


def head_logprobs(
    hidden: Tensor, weight: Tensor, labels: Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
    compute_dtype: torch.dtype | None = None, chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log pi(labels) and the entropy, from final hidden states and the LM head's weight (module docstring).

    ``hidden`` (N, H) and ``weight`` (V, H) (a bias-free head); ``labels`` (N,) integer ids.
    ``compute_dtype`` (default: ``hidden``'s) is the dtype of the matmuls. Returns float32 (N,)
    logprobs (float64 for float64 inputs) and the (N,) entropy, or None without ``with_entropy``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} must be (N, H) and (V, H) with the same H"
        )
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be ({hidden.shape[0]},), one per hidden row")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    rows = chunk_rows if chunk_rows is not None else max(1, _HEAD_CHUNK_ELEMENTS // max(weight.shape[0], 1))
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    sub_elements = _CHUNK_ELEMENTS.get(weight.device.type, _DEFAULT_CHUNK_ELEMENTS)
    sub_rows = max(1, min(rows, sub_elements // max(weight.shape[0], 1)))
    logprobs, entropy = _ChunkedHeadLogprob.apply(
        hidden, weight, labels.long(), float(temperature), with_entropy, rows, sub_rows, compute_dtype or hidden.dtype
    )
    return logprobs, (entropy if with_entropy else None)
