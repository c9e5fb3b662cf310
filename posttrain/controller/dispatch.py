"""How a registered call's arguments are split across ranks and its outputs joined again.

Pure functions over values (and :class:`GroupFuture` s from earlier non-blocking calls); the worker
group decides where the pieces run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.controller.decorator import Dispatch
from posttrain.protocol import Batch


@dataclass
class GroupFuture:
    """Outputs of a non-blocking call, one per called rank, not yet fetched.

    Passed as an argument to a DP_COMPUTE_PROTO / DP_MESH call on a group with the same ranks, each
    rank receives its own piece directly (on Ray, worker to worker through the object store).
    ``pad`` is the number of padding rows the pieces still carry; :meth:`get` strips them.
    """

    refs: list[Any]
    ranks: list[int]
    collect: Callable[[list[Any]], Any]
    fetch: Callable[[list[Any], list[int]], list[Any]]
    pad: int = 0
    layout: tuple | None = None  # (dp rank of each called rank, dp size) of a data-parallel split

    def get(self) -> Any:
        return own_batches(self.collect(self.fetch(self.refs, self.ranks)))


@dataclass
class Plan:
    """What to send: per called rank, its positional and keyword arguments; then how to collect."""

    ranks: list[int]
    args: list[tuple]
    kwargs: list[dict]
    collect: Callable[[list[Any]], Any]
    pad: int = 0
    layout: tuple | None = None


def plan_call(
    dispatch: Dispatch, args: tuple, kwargs: dict, world_size: int, mesh: Sequence[Any] | None = None
) -> Plan:
    if dispatch is Dispatch.ONE_TO_ALL:
        ranks = list(range(world_size))
        return Plan(ranks, [args] * world_size, [kwargs] * world_size, list)
    if dispatch is Dispatch.RANK_ZERO:
        return Plan([0], [args], [kwargs], lambda outs: outs[0])
    if dispatch is Dispatch.ALL_TO_ALL:
        return _plan_all_to_all(args, kwargs, world_size)
    if dispatch is Dispatch.DP_COMPUTE_PROTO:
        return _plan_data_parallel(args, kwargs, list(range(world_size)), list(range(world_size)), world_size)
    if dispatch is Dispatch.DP_MESH:
        if mesh is None:
            raise ValueError("DP_MESH needs the workers' mesh info")
        dp_size = mesh[0].dp_size
        ranks = list(range(world_size))
        plan = _plan_data_parallel(args, kwargs, ranks, [m.dp_rank for m in mesh], dp_size)
        collected = sorted((m.dp_rank, r) for r, m in enumerate(mesh) if m.is_collect)
        if [dp for dp, _ in collected] != list(range(dp_size)):
            raise ValueError(f"DP_MESH: exactly one worker per dp rank must collect; got {[m for m in mesh]}")
        keep = [r for _, r in collected]
        inner = plan.collect
        plan.collect = lambda outs: inner([outs[r] for r in keep])
        return plan
    raise ValueError(f"unknown dispatch mode {dispatch!r}")


def _plan_all_to_all(args: tuple, kwargs: dict, world_size: int) -> Plan:
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise ValueError(
                f"ALL_TO_ALL argument {name!r} must be a list with one entry per rank ({world_size}), got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    ranks = list(range(world_size))
    return Plan(
        ranks,
        [tuple(a[r] for a in args) for r in ranks],
        [{k: v[r] for k, v in kwargs.items()} for r in ranks],
        list,
    )


def _plan_data_parallel(args: tuple, kwargs: dict, ranks: list[int], dp_of_rank: list[int], dp_size: int) -> Plan:
    pads = set()
    layout = (tuple(dp_of_rank), dp_size)

    def pieces(value: Any) -> list[Any] | None:
        if isinstance(value, Batch):
            padded, pad = value.pad_to_divisor(dp_size)
            pads.add(pad)
            chunks = padded.chunk(dp_size)
            return [chunks[dp] for dp in dp_of_rank]
        if isinstance(value, GroupFuture) and value.ranks == ranks and value.layout == layout:
            pads.add(value.pad)
            return list(value.refs)
        if isinstance(value, GroupFuture):
            return pieces(value.get())
        return None

    split_args = [pieces(a) for a in args]
    split_kwargs = {k: pieces(v) for k, v in kwargs.items()}
    if len(pads) > 1:
        raise ValueError(f"data-parallel arguments disagree on padding {sorted(pads)}: pass Batches of the same length")
    pad = pads.pop() if pads else 0
    per_rank_args = [tuple(s[i] if s is not None else a for s, a in zip(split_args, args)) for i in range(len(ranks))]
    per_rank_kwargs = [
        {k: (s[i] if s is not None else kwargs[k]) for k, s in split_kwargs.items()} for i in range(len(ranks))
    ]
    return Plan(ranks, per_rank_args, per_rank_kwargs, lambda outs: collect_data_parallel(outs, pad), pad, layout)


def collect_data_parallel(outputs: list[Any], pad: int) -> Any:
    """Join per-rank Batches and strip the padding; other outputs come back as a list."""
    if outputs and all(isinstance(o, Batch) for o in outputs):
        return Batch.concat(outputs).unpad(pad)
    return outputs


def own_batches(value: Any) -> Any:
    """``value`` with every received Batch in it (at top level or in a list/tuple/dict) made writable."""
    if isinstance(value, Batch):
        return value.owned()
    if isinstance(value, (list, tuple)):
        return type(value)(own_batches(v) for v in value)
    if isinstance(value, dict):
        return {k: own_batches(v) for k, v in value.items()}
    return value
