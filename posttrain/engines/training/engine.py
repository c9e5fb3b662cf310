"""The training engine: one model, its optimizer and schedule, and its data-parallel sharding.

A plain class; policy, reference and critic workers each hold one. It knows nothing of PPO: a
worker passes the loss in. One engine per rank; with a process group of several ranks (set up by
``Worker.init_process_group``) every call below is collective, and every rank must make it.

    engine = TrainingEngine(TrainingEngineConfig(model_path=..., lr=1e-6))
    logprobs, entropy = engine.compute_logprobs(batch, max_tokens=4096, with_entropy=True)
    metrics = engine.train_mini_batch(mini_batch, loss_fn, micro_batch_size=4)

One optimizer step per mini-batch (:meth:`train_mini_batch`):
  1. split the mini-batch into micro-batches, by count or by a token budget, the same number on
     every rank (``micro_batches``), leaving out rows the caller marks as without gradient;
  2. N = the global loss normaliser, ``loss_normalizer(mask, loss_agg_mode)`` summed over the
     whole mini-batch on all ranks (``posttrain.algos.aggregation``);
  3. per micro-batch: forward (logprobs and entropy, or values), ``loss_fn(outputs, micro_batch,
     N)``, backward of the loss times the world size (DDP and FSDP average gradients over ranks;
     the losses need the sum, see ``parallel``). Micro-batch losses add up to the mini-batch loss,
     so any split gives the same update up to floating-point rounding;
  4. the global gradient norm; if it is not finite the step is skipped: gradients are dropped and
     the weights, optimizer state and LR schedule stay exactly as they were (``skipped`` = 1);
     otherwise gradients are clipped to ``grad_clip`` and AdamW and the schedule step.

``loss_fn(outputs: ForwardOutputs, micro_batch: Batch, global_normalizer: Tensor) -> (loss,
metrics)``: ``loss`` is a scalar normalised by ``global_normalizer``; ``metrics`` maps names
(without the prefix: ``pg_clipfrac``) to scalars that are *means over this micro-batch*. The engine
reports each as ``<metric_prefix>/<name>``, the mean over the mini-batch on all ranks, weighting
micro-batches by their share of the normaliser (exact for a mean over the normaliser's units, e.g.
a clip fraction over tokens under token-mean); over the rows that ran, and absent when none did.

Reported metrics (prefix ``config.metric_prefix``): ``loss`` (mini-batch loss, summed over
micro-batches and ranks), ``grad_norm`` (before clipping; inf/nan when skipped), ``lr`` (of this
update), ``skipped`` (1 if skipped), ``skipped_total``, ``micro_batches`` (on this rank), and with
``skip_rows`` given ``rows_skipped`` (the share of this rank's rows not run). Each is a mean
over one optimizer step, except ``skipped_total``, a running count; each is typed so where it is made
(``posttrain/metrics.py``: ``mean``, ``latest``), for whoever merges several steps or ranks.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posttrain import keys
from posttrain.algos import loss_normalizer
from posttrain.engines.training import checkpoint, parallel, weights
from posttrain.engines.training.config import TrainingEngineConfig
from posttrain.engines.training.inputs import (
    MODEL_INPUT_KEYS,
    check_batch,
    prompt_groups,
    real_token_counts,
    response_attention_mask,
)
from posttrain.engines.training.micro_batches import (
    equalize_group_count,
    scatter_rows,
    split_by_count,
    split_by_token_budget,
    split_units_by_token_budget,
)
from posttrain.engines.training.modeling import (
    ForwardOutputs,
    build_model,
    forward_micro_batch,
    model_shared_prompt_problem,
    resolve_attn_implementation,
)
from posttrain.engines.training.schedule import make_lr_scheduler
from posttrain.metrics import Metrics, latest, mean
from posttrain.models import resolve_dtype, resolve_model
from posttrain.protocol import Batch

LossFn = Callable[[ForwardOutputs, Batch, Tensor], tuple[Tensor, dict[str, Any]]]


class TrainingEngine:
    """Model, AdamW, LR schedule, mixed precision and DDP/FSDP2 for one rank (module docstring)."""

    def __init__(self, config: TrainingEngineConfig) -> None:
        self.config = config
        info = parallel.dist_info()
        self.rank, self.world_size = info.rank, info.world_size
        self.device = parallel.resolve_device(config.device)
        self.strategy = parallel.resolve_strategy(config.strategy, self.device, self.world_size)
        if config.cpu_offload and self.strategy != "fsdp":
            raise ValueError(f"cpu_offload=True needs FSDP2, but the strategy here is {self.strategy!r}; run on CUDA")
        self.compute_dtype = resolve_dtype(config.dtype, self.device)
        self.model_dir = resolve_model(config.model_path)
        # self.module: the model itself (FSDP2 shards it in place); self.model: what training calls
        # (the DDP wrapper under DDP, else the module).
        self.module = build_model(self.model_dir, config, resolve_attn_implementation(config.attn_implementation, self.device))
        self.share_prompt = config.share_prompt and config.pack_sequences
        if self.share_prompt and (problem := model_shared_prompt_problem(self.module)):
            raise ValueError(
                f"share_prompt=True cannot run {config.model_path}: {problem}; turn it off "
                "(actor_rollout_ref.model.share_prompt=false)"
            )
        self.model = self._distribute()
        if config.compile:
            self._compile()
        self.optimizer = _adamw([p for p in self.module.parameters() if p.requires_grad], config)
        self.scheduler = make_lr_scheduler(
            self.optimizer, config.lr_scheduler, warmup_steps=config.warmup_steps,
            total_steps=config.total_steps, min_lr_ratio=config.min_lr_ratio,
        )
        self.global_step = 0  # optimizer updates applied
        self.skipped_steps = 0  # updates skipped for a non-finite gradient

    def _compile(self) -> None:
        # Each decoder layer on its own (regional compilation): the layers share one code object and
        # torch.compile treats their weights as inputs, so one layer's graphs serve them all. On CPU
        # that compiled in ~40 s against ~320 s for the whole model, with the same speed after
        # (bench/update_peak.py --compile). Dynamic shapes from the start: micro-batches vary in length,
        # so a static first graph would be compiled again as a dynamic one at the second shape anyway
        # (first update 100.6 -> 74.4 s, docs/performance.md). In place, so the DDP wrapper and weight
        # loading see the same modules and parameter names.
        layers = parallel.decoder_layers(self.module)
        for layer in layers or [self.module]:
            layer.compile(dynamic=True)

    def _distribute(self) -> torch.nn.Module:
        if self.strategy == "fsdp":
            return parallel.apply_fsdp2(self.module, self.device, self.compute_dtype, self.config.cpu_offload)
        self.module.to(self.device)
        if self.strategy == "ddp":
            return parallel.wrap_ddp(self.module, self.device)
        return self.module

    @property
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ---- forward only ------------------------------------------------------------------------

    def compute_logprobs(
        self,
        batch: Batch,
        *,
        micro_batch_size: int | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        without_adapters: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """log pi(response token) (B, T) and, if asked, the entropy (B, T), float32 on CPU, no grad.

        Logits are divided by ``temperature`` (the rollout's sampling temperature). Padding gets 0.
        ``without_adapters``: with LoRA, the frozen base model's logprobs (a reference policy for free).
        """
        self._check_policy("compute_logprobs")
        if without_adapters and self.config.lora_rank == 0:
            raise ValueError("without_adapters=True needs a LoRA engine (lora_rank > 0); use a separate reference engine")
        adapters_off = self.module.disable_adapter() if without_adapters else contextlib.nullcontext()
        with adapters_off:
            outputs = self._forward_batch(batch, micro_batch_size, max_tokens, temperature, with_entropy)
        return outputs.logprobs, outputs.entropy

    def compute_values(
        self, batch: Batch, *, micro_batch_size: int | None = None, max_tokens: int | None = None
    ) -> Tensor:
        """The critic's value per response token (B, T), float32 on CPU, no grad; padding gets 0."""
        if not self.config.value_head:
            raise ValueError("compute_values needs a critic engine (TrainingEngineConfig(value_head=True))")
        return self._forward_batch(batch, micro_batch_size, max_tokens, 1.0, False).values

    def _check_policy(self, purpose: str) -> None:
        if self.config.value_head:
            raise ValueError(f"{purpose} needs a policy engine; this one has a value head (value_head=True)")

    @torch.no_grad()
    def _forward_batch(
        self, batch: Batch, micro_batch_size: int | None, max_tokens: int | None, temperature: float, with_entropy: bool
    ) -> ForwardOutputs:
        check_batch(batch, MODEL_INPUT_KEYS, "the training engine's forward pass")
        _check_temperature(temperature)
        self.module.eval()
        groups = self._micro_batch_groups(batch, micro_batch_size, max_tokens)
        pieces: dict[str, list[Tensor]] = {}
        inputs = batch.select(MODEL_INPUT_KEYS, meta_keys=[])
        for group in groups:
            # [] is a padding micro-batch (equal counts across ranks): rerun row 0 and drop it.
            micro_batch = _to_device(inputs.index(group or [0]), self.device)
            outputs = self._forward(self.module, micro_batch, temperature, with_entropy)
            for name in ("logprobs", "entropy", "values"):
                if getattr(outputs, name) is not None:
                    pieces.setdefault(name, []).append(getattr(outputs, name).cpu())
        merged = {name: scatter_rows(parts, groups, len(batch)) for name, parts in pieces.items()}
        return ForwardOutputs(**merged)

    def _forward(
        self, model: torch.nn.Module, micro_batch: Batch, temperature: float, with_entropy: bool
    ) -> ForwardOutputs:
        return forward_micro_batch(
            model, micro_batch, device=self.device, dtype=self.compute_dtype, value_head=self.config.value_head,
            temperature=temperature, with_entropy=with_entropy, pack=self.config.pack_sequences,
            share_prompt=self.share_prompt,
        )

    def _micro_batch_groups(
        self, batch: Batch, micro_batch_size: int | None, max_tokens: int | None, rows: list[int] | None = None
    ) -> list[list[int]]:
        """Micro-batches of ``rows`` (default: all) as lists of row indices; [] is a padding micro-batch."""
        if len(batch) == 0:
            raise ValueError("the engine got an empty Batch; every rank needs at least one sample")
        if micro_batch_size is not None and max_tokens is not None:
            raise ValueError("pass micro_batch_size or max_tokens, not both")
        rows = list(range(len(batch))) if rows is None else rows
        if self.share_prompt:
            # a group's rows side by side, so that micro-batches hold whole groups
            units = prompt_groups(batch)
            rows = sorted(rows, key=lambda row: (int(units[row]), row))
        if max_tokens is not None and self.share_prompt:
            lengths = real_token_counts(batch)[rows]
            responses = response_attention_mask(batch)[rows].long().sum(dim=1)
            local = split_units_by_token_budget(
                (lengths - responses).tolist(), responses.tolist(), units[rows].tolist(), max_tokens
            )
        elif max_tokens is not None:
            local = split_by_token_budget(real_token_counts(batch)[rows], max_tokens)
        else:
            local = split_by_count(len(rows), micro_batch_size)
        # with no rows to run, one padding micro-batch still gives every parameter a (zero) gradient
        groups = [[rows[i] for i in group] for group in local] or [[]]
        if self.world_size > 1:
            # Every rank runs the same number of forward passes (FSDP gathers in each one).
            groups = equalize_group_count(groups, parallel.max_over_ranks(len(groups)))
        return groups

    # ---- training ----------------------------------------------------------------------------

    def train_mini_batch(
        self,
        mini_batch: Batch,
        loss_fn: LossFn,
        *,
        micro_batch_size: int | None = None,
        max_tokens: int | None = None,
        loss_agg_mode: str = "token-mean",
        mask_key: str = keys.RESPONSE_MASK,
        temperature: float = 1.0,
        with_entropy: bool = False,
        skip_rows: Tensor | None = None,
    ) -> Metrics:
        """One optimizer step on ``mini_batch`` (this rank's share); returns the metrics (module docstring),
        each typed as it is made: a mean over this optimizer step, the running ``skipped_total`` as it stands.

        ``mask_key`` names the (B, T) mask the global normaliser counts under ``loss_agg_mode``.
        ``skip_rows`` (bool (B,)) marks rows whose loss is exactly 0 with a zero gradient: they count in
        the normaliser but are not run, which leaves the update as it would be and saves their forward
        and backward passes. ``loss_fn``'s metrics then cover the rows that ran.
        """
        check_batch(mini_batch, (*MODEL_INPUT_KEYS, mask_key), "train_mini_batch")
        _check_temperature(temperature)
        rows = None if skip_rows is None else _rows_to_run(skip_rows, len(mini_batch))
        groups = self._micro_batch_groups(mini_batch, micro_batch_size, max_tokens, rows)
        normalizer = parallel.all_reduce(loss_normalizer(mini_batch[mask_key], loss_agg_mode).to(self.device))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = _MetricTotals(self.device)
        for index, group in enumerate(groups):
            micro_batch = mini_batch.index(group) if group else _padding_micro_batch(mini_batch, mask_key)
            micro_batch = _to_device(micro_batch, self.device)
            with self._gradient_sync(last=index == len(groups) - 1):
                outputs = self._forward(self.model, micro_batch, temperature, with_entropy)
                loss, metrics = loss_fn(outputs, micro_batch, normalizer)
                _check_loss(loss)
                weight = 1.0 if group else 0.0  # a padding micro-batch: FSDP's collectives in step, zero gradients
                (loss * (weight * self.world_size)).backward()
            if group:
                totals.add(loss, metrics, loss_normalizer(micro_batch[mask_key], loss_agg_mode).to(self.device))
            else:
                totals.declare(metrics)  # a rank that ran padding only must still reduce the same metrics
        step_metrics = self._optimizer_step()
        step_metrics[self._name("micro_batches")] = mean(float(len(groups)))
        if rows is not None:
            step_metrics[self._name("rows_skipped")] = mean(1.0 - len(rows) / len(mini_batch))
        return {**{name: mean(value) for name, value in totals.reduce(self.config.metric_prefix).items()}, **step_metrics}

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        # DDP: all-reduce once, in the last micro-batch's backward. FSDP2 reduce-scatters in every
        # backward, which keeps only sharded gradients between micro-batches.
        if self.strategy == "ddp" and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _optimizer_step(self) -> Metrics:
        parameters = self.trainable_parameters
        norm = parallel.grad_norm(parameters)
        lr = self.optimizer.param_groups[0]["lr"]
        finite = math.isfinite(norm)
        if finite:
            max_norm = self.config.grad_clip
            if max_norm and norm > max_norm:
                parallel.scale_grads_(parameters, max_norm / (norm + 1e-6))
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {
            self._name("grad_norm"): mean(norm),
            self._name("lr"): mean(lr),
            self._name("skipped"): mean(0.0 if finite else 1.0),
            self._name("skipped_total"): latest(float(self.skipped_steps)),  # a running count: the last piece's
        }

    def _name(self, metric: str) -> str:
        return f"{self.config.metric_prefix}/{metric}"

    # ---- weights and checkpoints --------------------------------------------------------------

    def named_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
        """Full, merged weights under Hugging Face names, for the rollout engine (``weights``).

        Collective under FSDP: every rank iterates to the end.
        """
        return weights.named_weights(self.module, dtype=dtype)

    def export_hf(self, out_dir: str | Path, dtype: torch.dtype = torch.float32,
                  toward: tuple[str | Path, float] | None = None, average: Sequence[str | Path] = ()) -> Path:
        """A plain Hugging Face directory (safetensors, config, tokenizer); LoRA merged; ``average``: the mean of
        these checkpoints' weights (each loaded in turn, the weights alone; the engine's weights are left at the
        last) in place of the engine's own; ``toward=(MODEL_DIR, W)``: each weight moved back toward MODEL_DIR's,
        ``base + W * (weight - base)`` (``weights``). Collective."""
        values = None
        if average:  # the weights alone are read: no optimizer state
            load = functools.partial(checkpoint.load_weights, module=self.module)
            values = weights.averaged(self.module, [Path(d) for d in average], load, keep=self.rank == 0)
        return weights.export_hf(self.module, out_dir, source_dir=self.model_dir, write=self.rank == 0, dtype=dtype,
                                 toward=toward, values=values)

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Model, optimizer, scheduler, counters and RNG states (``checkpoint``). Collective."""
        state = {"global_step": self.global_step, "skipped_steps": self.skipped_steps, "world_size": self.world_size}
        return checkpoint.save_checkpoint(
            directory, module=self.module, optimizer=self.optimizer, scheduler=self.scheduler,
            engine_state=state, rank=self.rank,
        )

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore :meth:`save_checkpoint`'s state in place; the next update is the one that would have followed."""
        state = checkpoint.load_checkpoint(
            directory, module=self.module, optimizer=self.optimizer, scheduler=self.scheduler, rank=self.rank
        )
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state["skipped_steps"])


def _adamw(parameters: list[torch.nn.Parameter], config: TrainingEngineConfig) -> torch.optim.AdamW:
    # fused: one kernel per step over all parameters instead of a dozen per parameter; on CPU it
    # made a whole update of SmolLM2-135M 1.1x faster (bench/update.py). FSDP2's sharded DTensor
    # parameters keep PyTorch's default (foreach on CUDA).
    from torch.distributed.tensor import DTensor

    fused = all(p.device.type in ("cpu", "cuda") and not isinstance(p, DTensor) for p in parameters)
    return torch.optim.AdamW(
        parameters, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay,
        fused=fused or None,
    )


class _MetricTotals:
    """Sums over micro-batches, then one all-reduce: the loss, and normaliser-weighted metrics."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.loss = torch.zeros((), device=device)
        self.weight = torch.zeros((), device=device)
        self.weighted: dict[str, Tensor] = {}

    def add(self, loss: Tensor, metrics: dict[str, Any], weight: Tensor) -> None:
        self.loss += loss.detach().float()
        self.weight += weight
        for name, value in metrics.items():
            value = torch.as_tensor(value, dtype=torch.float32, device=self.device).detach()
            self.weighted[name] = self.weighted.get(name, torch.zeros((), device=self.device)) + value * weight

    def declare(self, metrics: dict[str, Any]) -> None:
        for name in metrics:
            self.weighted.setdefault(name, torch.zeros((), device=self.device))

    def reduce(self, prefix: str) -> dict[str, float]:
        names = sorted(self.weighted)
        packed = torch.stack([self.loss, self.weight, *(self.weighted[n] for n in names)])
        loss, weight, *sums = parallel.all_reduce(packed).tolist()
        # no row ran on any rank (all skipped): no mean to report, rather than a made-up 0
        means = {f"{prefix}/{name}": total / weight for name, total in zip(names, sums)} if weight > 0 else {}
        return {f"{prefix}/loss": loss, **means}


def _to_device(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return Batch({k: v.to(device, non_blocking=True) for k, v in batch.tensors.items()}, batch.non_tensors, batch.meta)


def _rows_to_run(skip_rows: Tensor, num_rows: int) -> list[int]:
    if skip_rows.dtype != torch.bool or tuple(skip_rows.shape) != (num_rows,):
        raise ValueError(
            f"skip_rows must be a bool tensor of shape ({num_rows},), one flag per row of the mini-batch; "
            f"got {skip_rows.dtype} {tuple(skip_rows.shape)}"
        )
    return (~skip_rows).nonzero().flatten().tolist()


def _padding_micro_batch(mini_batch: Batch, mask_key: str) -> Batch:
    row = mini_batch.index([0])
    return Batch({**row.tensors, mask_key: torch.zeros_like(row[mask_key])}, row.non_tensors, row.meta)


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(
            f"temperature={temperature} must be > 0; for greedy rollouts (temperature 0) the behaviour "
            "logprobs are untempered, so pass 1.0"
        )


def _check_loss(loss: Tensor) -> None:
    if not isinstance(loss, Tensor) or loss.dim() != 0 or not loss.requires_grad:
        raise ValueError(
            "loss_fn must return (scalar loss tensor with a gradient, metrics dict); got a loss of "
            f"{type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}: build it from the ForwardOutputs it received"
        )
