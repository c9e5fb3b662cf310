"""The Batch: what flows between the controller and the workers (verl calls it DataProto).

A Batch holds
  * ``tensors``      — torch tensors that all share the first (sample) dimension,
  * ``non_tensors``  — per-sample Python values as 1-D numpy object arrays of the same length
                       (strings, dicts, ground truths),
  * ``meta``         — a small dict that is not per-sample (temperature, metrics, the weight version).

Every operation returns a new Batch and leaves its inputs alone (tensors may be shared, never
written). Through Ray's object store a Batch travels as numpy buffers that pickle protocol 5 hands
over out-of-band, so a tensor is never pickled element by element and a worker on the same node
reads it from shared memory.

The keys the system itself uses are the constants in :mod:`posttrain.keys`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import warnings

import numpy as np
import torch

from posttrain.keys import GROUP_COUNT, KL_GROUP_COUNT

METRICS_META_KEY = "metrics"


class BatchError(ValueError):
    """A Batch was built or combined inconsistently; the message says which key and how. A bug in
    the code that built it, not in a person's input, so its traceback is kept (not a PosttrainError)."""


def _as_object_array(name: str, values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise BatchError(f"non-tensor column {name!r} must be 1-D (one value per sample), got shape {values.shape}")
    array = np.empty(len(values), dtype=object)
    for index, value in enumerate(values):  # one by one: equal-length lists must stay list objects
        array[index] = value
    return array


def pad_rows(
    rows: Sequence[Sequence[int | float]], width: int, fill: int | float = 0, *, left: bool = False,
    dtype: torch.dtype = torch.long,
) -> torch.Tensor:
    """Variable-length rows as one (len(rows), width) tensor filled with ``fill``.  # list of lists -> (B, W)

    Rows are right-padded (responses), or left-padded with ``left=True`` (prompts, so that they end
    where generation starts). A row longer than ``width`` is refused.
    """
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for index, row in enumerate(rows):
        if len(row) > width:
            raise BatchError(f"row {index} has {len(row)} values, more than the width {width}")
        if len(row):
            values = torch.as_tensor(row, dtype=dtype)
            if left:
                out[index, width - len(row):] = values
            else:
                out[index, : len(row)] = values
    return out


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # Tensors still pointing into read-only shared memory (Ray's object store) after unpickling;
    # see owned(). Empty for every Batch built in this process.
    borrowed: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tensors = dict(self.tensors)
        self.non_tensors = {k: _as_object_array(k, v) for k, v in self.non_tensors.items()}
        self.meta = dict(self.meta)
        self._check_lengths()

    # ---- construction and inspection -------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Batch:
        return cls(dict(tensors or {}), dict(non_tensors or {}), dict(meta or {}))

    def _check_lengths(self) -> None:
        lengths = {f"tensor {k!r}": v.shape[0] if v.dim() else None for k, v in self.tensors.items()}
        lengths |= {f"non-tensor {k!r}": len(v) for k, v in self.non_tensors.items()}
        if None in lengths.values():
            scalar = [k for k, n in lengths.items() if n is None]
            raise BatchError(f"{scalar[0]} is a 0-d tensor; per-sample tensors need a first dimension (put scalars in meta)")
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {n}" for k, n in lengths.items())
            raise BatchError(f"all columns of a Batch must have the same number of samples; got {detail}")

    def __len__(self) -> int:
        for column in (*self.tensors.values(), *self.non_tensors.values()):
            return len(column)
        return 0

    def __getitem__(self, key: str) -> torch.Tensor | np.ndarray:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no column {key!r}; it has {sorted(self.keys())}")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.tensors.items())
        return f"Batch(len={len(self)}, tensors={{{shapes}}}, non_tensors={list(self.non_tensors)}, meta={list(self.meta)})"

    # ---- selecting columns ------------------------------------------------------------------

    def select(self, keys: Sequence[str] | None = None, meta_keys: Sequence[str] | None = None) -> Batch:
        """Keep only ``keys`` (tensor or non-tensor) and ``meta_keys`` (default: all meta)."""
        keys = self.keys() if keys is None else list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"cannot select {missing}: Batch has {sorted(self.keys())}")
        meta = self.meta if meta_keys is None else {k: self.meta[k] for k in meta_keys}
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            meta,
        )

    def pop(self, keys: Sequence[str]) -> Batch:
        """Remove ``keys`` from this Batch and return them as a new Batch (meta is copied)."""
        popped = self.select(keys)
        for k in keys:
            self.tensors.pop(k, None)
            self.non_tensors.pop(k, None)
        return popped

    def union(self, other: Batch) -> Batch:
        """Columns of both; a key present in both must hold equal values, else BatchError."""
        if len(self) and len(other) and len(self) != len(other):
            raise BatchError(f"cannot union Batches of {len(self)} and {len(other)} samples")
        for k in self.tensors.keys() & other.tensors.keys():
            a, b = self.tensors[k], other.tensors[k]
            if a.shape != b.shape or not torch.equal(a, b):
                raise BatchError(f"union: tensor {k!r} differs between the two Batches; pop or rename it on one side first")
        for k in self.non_tensors.keys() & other.non_tensors.keys():
            if not np.array_equal(self.non_tensors[k], other.non_tensors[k]):
                raise BatchError(f"union: non-tensor {k!r} differs between the two Batches; pop or rename it on one side first")
        for k in self.meta.keys() & other.meta.keys():
            if not _meta_equal(self.meta[k], other.meta[k]):
                raise BatchError(f"union: meta {k!r} differs ({self.meta[k]!r} vs {other.meta[k]!r})")
        return Batch(self.tensors | other.tensors, self.non_tensors | other.non_tensors, self.meta | other.meta)

    # ---- selecting rows ---------------------------------------------------------------------

    def index(self, index: torch.Tensor | np.ndarray | Sequence[int] | slice) -> Batch:
        """Rows by an index (integer array, boolean mask or slice); meta is kept."""
        if isinstance(index, slice):
            return Batch(
                {k: v[index] for k, v in self.tensors.items()},
                {k: v[index] for k, v in self.non_tensors.items()},
                self.meta,
            )
        array = np.asarray(index)
        idx = torch.as_tensor(array if array.dtype == bool else array.astype(np.int64))
        if idx.dtype == torch.bool:
            if idx.shape[0] != len(self):
                raise BatchError(f"boolean index of length {idx.shape[0]} for a Batch of {len(self)}")
            idx = idx.nonzero().flatten()
        idx_np = idx.numpy()
        return Batch(
            {k: v.index_select(0, idx) for k, v in self.tensors.items()},
            {k: v[idx_np] for k, v in self.non_tensors.items()},
            self.meta,
        )

    def reorder(self, order: torch.Tensor | np.ndarray | Sequence[int]) -> Batch:
        """Rows permuted by ``order`` (a permutation of range(len)); see :meth:`index` for subsets."""
        order_np = np.asarray(order)
        if sorted(order_np.tolist()) != list(range(len(self))):
            raise BatchError(f"reorder needs a permutation of range({len(self)}); use index() to take a subset")
        return self.index(order_np)

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each sample ``times`` times: interleaved (a a b b: a GRPO group stays contiguous) or tiled (a b a b)."""
        if times < 1:
            raise BatchError(f"repeat times must be >= 1, got {times}")
        if interleave:
            rep_t = lambda v: v.repeat_interleave(times, dim=0)  # noqa: E731
            rep_n = lambda v: np.repeat(v, times)  # noqa: E731
        else:
            rep_t = lambda v: v.repeat(times, *([1] * (v.dim() - 1)))  # noqa: E731
            rep_n = lambda v: np.tile(v, times)  # noqa: E731
        return Batch(
            {k: rep_t(v) for k, v in self.tensors.items()},
            {k: rep_n(v) for k, v in self.non_tensors.items()},
            self.meta,
        )

    # ---- splitting and joining --------------------------------------------------------------

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` samples (the last may be shorter)."""
        if size < 1:
            raise BatchError(f"split size must be >= 1, got {size}")
        return [self.index(slice(start, start + size)) for start in range(0, len(self), size)]

    def chunk(self, chunks: int) -> list[Batch]:
        """``chunks`` equal pieces; the length must divide (use :meth:`pad_to_divisor` first)."""
        if chunks < 1 or len(self) % chunks:
            raise BatchError(
                f"cannot chunk {len(self)} samples into {chunks} equal parts; pad_to_divisor({chunks}) first"
            )
        return self.split(len(self) // chunks) if len(self) else [self] * chunks

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append copies of the first rows until the length divides by ``divisor``.

        Returns the padded Batch and the number of rows added, for :meth:`unpad` after collecting.
        """
        pad = -len(self) % divisor
        if pad == 0:
            return self, 0
        if len(self) == 0:
            raise BatchError("cannot pad an empty Batch")
        filler = self.index(np.arange(pad) % len(self))
        return Batch.concat([self, filler]), pad

    def unpad(self, pad: int) -> Batch:
        return self if pad == 0 else self.index(slice(0, len(self) - pad))

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Join along samples. Meta must agree, except ``metrics`` (dict of name -> value or list),
        which is merged into lists so per-worker metrics survive the collect."""
        if not batches:
            raise BatchError("concat of no Batches")
        first = batches[0]
        for b in batches[1:]:
            if b.tensors.keys() != first.tensors.keys() or b.non_tensors.keys() != first.non_tensors.keys():
                raise BatchError(f"concat: key sets differ: {sorted(first.keys())} vs {sorted(b.keys())}")
        tensors = {k: _cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        return Batch(tensors, non_tensors, _merge_meta([b.meta for b in batches]))

    def minibatches(
        self, size: int, *, epochs: int = 1, shuffle: bool = True, seed: int = 0, group_ids: torch.Tensor | None = None,
        count: int | None = None,
    ) -> Iterator[Batch]:
        """Mini-batches of ``size`` for ``epochs`` passes; reshuffled each epoch from ``seed``.

        ``size`` must divide the length, so every mini-batch (and every gradient step) is the same size.
        ``group_ids`` (B,): whole groups are shuffled, each group's samples staying side by side, so a
        mini-batch holds whole groups where the sizes allow (a group's prompt can then be computed once).
        ``count`` instead of ``size``: that many mini-batches per epoch, of as even a number of samples
        as whole groups allow (groups whose samples vary, an agent program's; every rank makes the same
        number of optimizer steps whatever its share of samples). Groups are cut only where a mini-batch
        would otherwise be empty.
        """
        if count is not None:
            if not 1 <= count <= len(self):
                raise BatchError(f"{count} mini-batches cannot be made of {len(self)} samples")
        elif size < 1 or len(self) % size:
            raise BatchError(f"mini-batch size {size} must divide the batch of {len(self)} samples")
        if group_ids is not None and tuple(group_ids.shape) != (len(self),):
            raise BatchError(f"group_ids has shape {tuple(group_ids.shape)}; it needs one id per sample ({len(self)},)")
        generator = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            if not shuffle:
                order = torch.arange(len(self))
            elif group_ids is None:
                order = torch.randperm(len(self), generator=generator)
            else:
                groups = torch.unique(group_ids)
                rank = torch.empty_like(groups)
                rank[torch.randperm(len(groups), generator=generator)] = torch.arange(len(groups))
                position = rank[torch.searchsorted(groups, group_ids)]
                order = torch.argsort(position * len(self) + torch.arange(len(self)))
            if count is None:
                for start in range(0, len(self), size):
                    yield self.index(order[start : start + size])
                continue
            bounds = _even_bounds(group_ids[order] if group_ids is not None else None, len(self), count)
            for start, end in zip(bounds, bounds[1:]):
                yield self.index(order[start:end])

    # ---- metrics in meta --------------------------------------------------------------------

    @property
    def metrics(self) -> dict[str, Any]:
        return self.meta.get(METRICS_META_KEY, {})

    def with_metrics(self, metrics: Mapping[str, Any]) -> Batch:
        return Batch(self.tensors, self.non_tensors, self.meta | {METRICS_META_KEY: dict(metrics)})

    def copy(self) -> Batch:
        """A Batch with its own copy of every tensor (non-tensor values are shared)."""
        return Batch({k: v.clone() for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))

    def owned(self) -> Batch:
        """This Batch with every borrowed tensor copied into memory it may write to.

        A Batch unpickled from Ray's object store first points at the store's read-only shared
        memory (no copy). The controller and the worker hosts call this before user code sees a
        received Batch; :meth:`concat` copies anyway and so skips it. Whoever calls ``ray.get`` on a
        Batch directly should call it too before writing to its tensors.
        """
        if not self.borrowed:
            return self
        tensors = {k: _copy(v) if k in self.borrowed else v for k, v in self.tensors.items()}
        return Batch(tensors, self.non_tensors, self.meta)

    # ---- transport --------------------------------------------------------------------------

    def __reduce__(self):
        # Tensors go as numpy arrays (bf16 as raw 16-bit words, which numpy lacks), so pickle
        # protocol 5 — and with it Ray's object store — moves their buffers without copying
        # them into the pickle stream.
        packed = {k: _tensor_to_numpy(v) for k, v in self.tensors.items()}
        return (_rebuild_batch, (packed, self.non_tensors, self.meta))


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), ""


def _numpy_to_tensor(array: np.ndarray, view_as: str) -> torch.Tensor:
    if not array.flags.writeable:
        with warnings.catch_warnings():  # torch warns on read-only buffers; Batch.borrowed tracks them
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(array)
    else:
        t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if view_as == "bfloat16" else t


def _rebuild_batch(packed: dict[str, tuple[np.ndarray, str]], non_tensors: dict, meta: dict) -> Batch:
    batch = Batch({k: _numpy_to_tensor(*v) for k, v in packed.items()}, non_tensors, meta)
    batch.borrowed = frozenset(k for k, (array, _) in packed.items() if not array.flags.writeable)
    return batch


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    # One memcpy in numpy: torch.clone goes through the intra-op thread pool (see _cat).
    if tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16:
        return torch.from_numpy(tensor.numpy().copy())
    return tensor.clone()


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    # On CPU, torch.cat's intra-op thread pool is slower than one memcpy when other processes
    # hold the cores (measured 8x on 2 cores); numpy concatenates in one thread.
    if all(t.device.type == "cpu" and t.dtype != torch.bfloat16 for t in tensors):
        return torch.from_numpy(np.concatenate([t.detach().numpy() for t in tensors]))
    return torch.cat(tensors)


def _meta_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (ValueError, RuntimeError):  # arrays/tensors: elementwise == has no single truth value
        return a is b


def mini_batch_count(batch: Batch, groups_per_mini_batch: int) -> int | None:
    """Optimizer steps per epoch for a batch whose groups vary in samples (meta GROUP_COUNT, set by the
    trainer for the whole batch, so every rank agrees): its groups over the mini-batch's, less the groups
    kept for the KL loss alone (meta KL_GROUP_COUNT: they ride in those steps, adding none); None for a
    batch of whole groups of ``rollout.n``, which splits by size."""
    groups = batch.meta.get(GROUP_COUNT)
    return None if groups is None else max(1, (int(groups) - int(batch.meta.get(KL_GROUP_COUNT, 0))) // groups_per_mini_batch)


def _even_bounds(ordered_group_ids: torch.Tensor | None, length: int, count: int) -> list[int]:
    """``count + 1`` cut points over ``length`` ordered samples: near ``i * length / count``, moved to the
    nearest edge between groups where that keeps every piece non-empty."""
    if ordered_group_ids is None or length == 0:
        edges = list(range(length + 1))
    else:
        change = torch.nonzero(ordered_group_ids[1:] != ordered_group_ids[:-1]).squeeze(1) + 1
        edges = [0, *change.tolist(), length]
    cuts = [0]
    for piece in range(1, count):
        ideal = piece * length / count
        low, high = cuts[-1] + 1, length - (count - piece)  # room for every later piece
        candidates = [edge for edge in edges if low <= edge <= high]
        cut = min(candidates, key=lambda edge: abs(edge - ideal)) if candidates else max(low, min(round(ideal), high))
        cuts.append(cut)
    return [*cuts, length]


def _merge_meta(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    metric_lists: dict[str, list[Any]] = {}
    for meta in metas:
        for k, v in meta.items():
            if k == METRICS_META_KEY:
                for name, value in v.items():
                    metric_lists.setdefault(name, []).extend(value if isinstance(value, list) else [value])
            elif k in merged and not _meta_equal(merged[k], v):
                raise BatchError(f"concat: meta {k!r} differs between Batches ({merged[k]!r} vs {v!r})")
            else:
                merged[k] = v
    if metric_lists:
        merged[METRICS_META_KEY] = metric_lists
    return merged
