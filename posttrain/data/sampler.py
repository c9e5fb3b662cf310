"""Which rows a training batch holds, when plain shuffling is not enough: strata with shares, and a
difficulty curriculum. Seeded, and resumable exactly from its ``state_dict``.

``data.sampler`` (``config/schema.py: SamplerConfig``) turns it on; without it the loader keeps
:class:`~posttrain.data.loader.EpochSampler` (one shuffled order per epoch).

**Strata.** Each row belongs to the stratum named by one of its columns (``stratify_by``:
``data_source`` or ``extra_info.<field>``, e.g. a BFCL row's category). A stratum's share of every
batch is its ``shares`` entry, or, for the strata without one, what is left in proportion to their rows.
Seats are allocated by largest remainder: each stratum gets the whole part of its share of the batch, and
the seats left go one each to the strata with the largest remainders, where a remainder counts what the
stratum is short of its share of all rows handed out at this level so far (ties: the stratum named first).
So a stratum's count in a batch is its share of the batch rounded down or up, never further, and its count
over the run stays within a row of its share of all rows handed out (a share of 0.1 of batches of 8 is 0.8
rows a batch: one row in four batches of five, none in the fifth; three equal strata in batches of 8 get
3, 3, 2, then 3, 2, 3, then 2, 3, 3).
At a curriculum level where only strata with shares are present, their shares are scaled to add up to 1. Within a stratum, rows come in a shuffled order of their own, drawn anew from
``(seed, stratum, pass)`` each time the stratum is used up; a batch never holds a row twice (at a
pass's end, rows of the new pass already in the batch wait for the next one).

**Curriculum.** Rows carry a level (``curriculum.key``, e.g. ``extra_info.level``; the values ordered
as ``curriculum.levels`` lists them, or sorted). Batches hold rows of the current level only. After
each training step the trainer reports the accuracy of its samples (:meth:`StratifiedSampler.observe`);
when the mean accuracy of the current level's samples over the last ``window`` steps that had any
reaches ``threshold``, the level steps up (the last level stays; an asynchronous step may train only rows
drawn before the step up, and counts for nothing). ``curriculum/level`` (its index, from 0) and
``curriculum/accuracy`` are logged each step. Strata apply within the level.

Mixtures of environments (several datasets, each with a weight) are strata of this sampler: a
stratum per source, its weight its share.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posttrain.errors import InputError

COLUMNS = ("data_source", "extra_info.<field>")  # what stratify_by and curriculum.key may name


def row_value(sample: Any, key: str) -> Any:
    """The value ``key`` names in a dataset row (:class:`~posttrain.data.dataset.PromptSample`):
    ``data_source`` or ``extra_info.<field>``."""
    if key == "data_source":
        return sample.data_source
    if key.startswith("extra_info."):
        field = key.removeprefix("extra_info.")
        info = sample.extra_info or {}
        if field not in info:
            raise InputError(f"row {sample.row} of {sample.file} has no extra_info.{field} (data.sampler reads it); "
                             f"its extra_info has {sorted(info)}")
        return info[field]
    raise InputError(f"data.sampler reads a column named {key!r}; give one of {', '.join(COLUMNS)}")


@dataclass(frozen=True)
class Curriculum:
    """When to step up: the current level's mean accuracy over the last ``window`` steps >= ``threshold``."""

    threshold: float
    window: int

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise InputError(f"data.sampler.curriculum.threshold={self.threshold}: an accuracy in (0, 1] that steps the level up")
        if self.window < 1:
            raise InputError(f"data.sampler.curriculum.window={self.window}: the steps whose accuracy is averaged, at least 1")


class StratifiedSampler:
    """Batches of dataset indices by strata and level (module docstring); :class:`EpochSampler`'s interface
    (``__iter__`` the rest of an epoch, ``epoch``, ``__len__``, ``state_dict``) plus :meth:`observe`.

    ``strata[i]`` and ``levels[i]`` are row ``i``'s stratum and level (``levels`` None: no curriculum).
    An epoch is ``len(self)`` batches, as many rows as the dataset holds. Thread-safe: in async mode the
    generators draw batches while the trainer tells the curriculum its accuracies and checkpoints.
    """

    def __init__(self, strata: Sequence[Any], batch_size: int, *, seed: int = 0, shares: Mapping[str, float] | None = None,
                 levels: Sequence[Any] | None = None, level_order: Sequence[Any] | None = None,
                 curriculum: Curriculum | None = None) -> None:
        if batch_size < 1:
            raise InputError(f"batch size must be at least 1, got {batch_size}")
        if (levels is None) != (curriculum is None):
            raise ValueError("levels and curriculum go together")
        self.num_samples, self.batch_size, self.seed = len(strata), batch_size, seed
        if self.num_samples < batch_size:
            raise InputError(f"the dataset has {self.num_samples} prompts, fewer than one batch of {batch_size}; "
                             "lower data.train_batch_size or add prompts")
        self.curriculum = curriculum
        names = [str(s) for s in strata]
        self.stratum_names = list(dict.fromkeys(names))  # in the order the rows first name them
        row_levels = [None] * len(names) if levels is None else list(levels)
        self.levels = [None] if levels is None else _level_order(row_levels, level_order)
        shares = dict(shares or {})
        unknown = sorted(set(shares) - set(self.stratum_names))
        if unknown:
            raise InputError(f"data.sampler.shares names {unknown}, which no training row is in; the strata are {self.stratum_names}")
        # rows per (level, stratum), in dataset order, grouped in one pass
        level_of = {level: index for index, level in enumerate(self.levels)}
        self.row_level = np.array([level_of[level] for level in row_levels], dtype=np.int64)  # each row's level index
        grouped: dict[tuple[int, str], list[int]] = {}
        for row, (name, level) in enumerate(zip(names, self.row_level.tolist())):
            grouped.setdefault((level, name), []).append(row)
        self.rows = {key: np.array(grouped[key], dtype=np.int64)
                     for key in sorted(grouped, key=lambda k: (k[0], self.stratum_names.index(k[1])))}
        self.shares = [self._level_shares(level_index, shares) for level_index in range(len(self.levels))]
        self._identity = {"kind": "stratified", "num_samples": self.num_samples, "seed": seed, "batch_size": batch_size,
                          "strata": self.stratum_names, "levels": [repr(level) for level in self.levels],
                          "shares": {name: share for name, share in sorted(shares.items())}}
        self._lock = threading.Lock()
        self._batches, self._level, self._level_batches = 0, 0, 0
        self._given: dict[str, int] = {}  # rows handed out per stratum at this level
        self._cursor: dict[tuple[int, str], tuple[int, int, list[int]]] = {}  # (pass, index, rows waiting)
        self._window: list[tuple[float, int]] = []  # (accuracy sum, samples) of the current level's last steps

    # ---- what EpochSampler offers ----------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._batches // len(self)

    @property
    def level(self) -> int:
        return self._level

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def draw_tag(self) -> str:
        """The last batch's place, ``"<epoch>.<batch>"``: its prompts' ids (``loader.prompt_uid``), unique
        though a stratum's rows come round more than once an epoch."""
        return f"{(self._batches - 1) // len(self)}.{self._batches - 1}"

    def __iter__(self) -> Iterator[np.ndarray]:
        """Index arrays for the rest of the current epoch, each drawn when asked for (so a level that
        stepped up after a step already shapes the next batch)."""
        batch, epoch = self._next_batch(None)  # the first batch's epoch, read with it: another thread may end one between
        while batch is not None:
            yield batch
            batch, _ = self._next_batch(epoch)

    def rows_drawn(self) -> dict[str, tuple[int, int]]:
        """Per stratum, over the levels: (rows handed out at least once so far, rows). A stratum's first pass
        hands out each row once, in its order: past it, every row was drawn."""
        counts: dict[str, tuple[int, int]] = {}
        with self._lock:
            for key, rows in self.rows.items():
                pass_, index, _ = self._cursor.get(key, (0, 0, []))
                drawn, total = counts.get(key[1], (0, 0))
                counts[key[1]] = (drawn + (len(rows) if pass_ > 0 else index), total + len(rows))
        return counts

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return self._identity | {
                "batches": self._batches, "level": self._level, "level_batches": self._level_batches, "given": dict(self._given),
                "cursor": [[level, name, *position[:2], list(position[2])] for (level, name), position in self._cursor.items()],
                "window": [list(w) for w in self._window]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of a sampler built alike (data, seed, batch size, strata, levels, shares)."""
        theirs = {key: state.get(key) for key in self._identity}
        if theirs != self._identity:
            differ = ", ".join(f"{key} {theirs[key]!r} (now {mine!r})" for key, mine in self._identity.items() if theirs[key] != mine)
            raise InputError(
                f"the checkpoint's data position was drawn otherwise: {differ}; resuming would replay different prompts. "
                "Use the same data, data.seed, data.train_batch_size and data.sampler, or start fresh (trainer.resume_mode=disable)")
        with self._lock:
            self._batches, self._level, self._level_batches = int(state["batches"]), int(state["level"]), int(state["level_batches"])
            self._given = {str(k): int(v) for k, v in state["given"].items()}
            self._cursor = {(int(level), str(name)): (int(pass_), int(index), [int(r) for r in waiting])
                            for level, name, pass_, index, waiting in state["cursor"]}
            self._window = [(float(total), int(count)) for total, count in state["window"]]

    # ---- the curriculum --------------------------------------------------------------------
    def observe(self, rows: Sequence[int], accuracy: Sequence[float]) -> dict[str, float]:
        """A trained step's samples: their dataset rows and accuracies. Steps the level up when the
        current level's accuracy over the window reaches the threshold; returns the ``curriculum/*`` metrics."""
        if self.curriculum is None:
            return {}
        with self._lock:
            mine = [float(a) for r, a in zip(rows, accuracy) if self.row_level[int(r)] == self._level]
            if mine:  # a step with none of this level's samples (async, just after a step up) counts for nothing
                self._window = (self._window + [(sum(mine), len(mine))])[-self.curriculum.window:]
            metrics = {"curriculum/level": float(self._level)}
            count = sum(w[1] for w in self._window)
            if count:
                metrics["curriculum/accuracy"] = sum(w[0] for w in self._window) / count
            full = len(self._window) == self.curriculum.window
            if full and metrics["curriculum/accuracy"] >= self.curriculum.threshold and self._level + 1 < len(self.levels):
                self._level, self._level_batches, self._given, self._window = self._level + 1, 0, {}, []
            return metrics

    # ---- drawing ---------------------------------------------------------------------------
    def _level_shares(self, level: int, shares: Mapping[str, float]) -> dict[str, float]:
        """Each stratum's share of a batch at ``level`` (module docstring); refuses shares that cannot be met."""
        present = {name: len(rows) for (lv, name), rows in self.rows.items() if lv == level}
        where = "" if self.levels == [None] else f" at level {self.levels[level]!r}"
        given = {name: float(share) for name, share in shares.items() if name in present}
        bad = {name: share for name, share in given.items() if not 0 < share <= 1}
        if bad:
            raise InputError(f"data.sampler.shares {bad}: each share is a fraction of a batch in (0, 1]")
        rest = {name: rows for name, rows in present.items() if name not in given}
        left = 1.0 - sum(given.values())
        if given and not rest:  # every stratum of this level has a share: scaled to add up to 1 (module docstring)
            if left < -1e-6 and shares.keys() == given.keys():
                raise InputError(f"data.sampler.shares {given} sum to {sum(given.values()):.6g}: at most 1")
            result = {name: share / sum(given.values()) for name, share in given.items()}
        elif left <= 1e-6:
            raise InputError(f"data.sampler.shares {given}{where} sum to {sum(given.values()):.6g}, leaving nothing for "
                             f"{sorted(rest)}: give those strata shares too, or lower these")
        else:
            result = given | {name: left * rows / sum(rest.values()) for name, rows in rest.items()}
        for name, share in result.items():
            most = min(int(np.ceil(share * self.batch_size)) + 1, self.batch_size)
            if present[name] < most:
                if self.stratum_names == ["all"] and not given:
                    raise InputError(f"level {self.levels[level]!r} has {present[name]} training rows, fewer than a batch of "
                                     f"{self.batch_size} (data.train_batch_size); add rows to it or lower the batch size")
                raise InputError(f"stratum {name!r}{where} has {present[name]} rows, but its share {share:.3g} of a batch of "
                                 f"{self.batch_size} can ask for {most} in one batch; add rows or lower its share")
        return result

    def _allocate(self) -> dict[str, int]:
        """Seats of the next batch per stratum, by largest remainder: each stratum the whole part of its share of
        the batch, the seats left one each to the strata with the largest remainders, a remainder counting what
        the stratum is short of its share of every row handed out at this level so far (so a remainder passed
        over in one batch wins a later one)."""
        shares, given = self.shares[self._level], self._given
        total = (self._level_batches + 1) * self.batch_size
        seats = {name: int(np.floor(share * self.batch_size + 1e-9)) for name, share in shares.items()}
        owed = {name: share * total - given.get(name, 0) - seats[name] for name, share in shares.items()}
        left = self.batch_size - sum(seats.values())
        for name in sorted(shares, key=lambda n: -owed[n])[:left]:  # a stable sort: equals in the order strata were named
            seats[name] += 1
        return {name: count for name, count in seats.items() if count}

    def _next_batch(self, epoch: int | None) -> tuple[np.ndarray | None, int]:
        """The next batch and the epoch it belongs to; (None, epoch) when ``epoch`` (None: any) has ended."""
        with self._lock:  # the level, the cursors and the counts move together
            current = self.epoch
            if epoch is not None and current != epoch:
                return None, current
            level, seats = self._level, self._allocate()
            batch: list[int] = []
            for name, count in seats.items():
                batch += self._draw((level, name), count)
                self._given[name] = self._given.get(name, 0) + count
            self._batches += 1
            self._level_batches += 1
            return np.array(batch, dtype=np.int64), current

    def _draw(self, key: tuple[int, str], count: int) -> list[int]:
        """``count`` distinct rows of one stratum, continuing its shuffled order (module docstring)."""
        pass_, index, waiting = self._cursor.get(key, (0, 0, []))
        drawn = waiting[:count]
        waiting = waiting[count:]
        while len(drawn) < count:
            order = self._order(key, pass_)
            if index >= len(order):
                pass_, index = pass_ + 1, 0
                continue
            row = int(order[index])
            index += 1
            if row in drawn:  # at a pass's start, a row this batch already holds waits for the next batch
                waiting.append(row)
            else:
                drawn.append(row)
        self._cursor[key] = (pass_, index, waiting)
        return drawn

    def _order(self, key: tuple[int, str], pass_: int) -> np.ndarray:
        level, name = key
        stratum = self.stratum_names.index(name)
        return self.rows[key][np.random.default_rng([self.seed, level, stratum, pass_]).permutation(len(self.rows[key]))]


def _level_order(row_levels: Sequence[Any], listed: Sequence[Any] | None) -> list[Any]:
    """The curriculum's levels in order: as listed (each must have rows, every row's must be listed), else sorted."""
    present = list(dict.fromkeys(row_levels))
    if not listed:
        try:
            ordered = sorted(present)
        except TypeError:
            raise InputError(f"the rows' levels {present} cannot be ordered; list them in data.sampler.curriculum.levels") from None
        if len(ordered) < 2:
            raise InputError(f"data.sampler.curriculum.key: every training row has level {ordered}; a curriculum steps between "
                             "at least two levels (prepare the data with several, e.g. a preparer's levels option)")
        return ordered
    listed = list(listed)
    if len(listed) < 2:
        raise InputError(f"data.sampler.curriculum.levels {listed}: a curriculum steps between at least two levels")
    missing = [level for level in listed if level not in present]
    unlisted = [level for level in present if level not in listed]
    if missing or unlisted:
        raise InputError(f"data.sampler.curriculum.levels {listed}: " + "; ".join(
            part for part in (f"no training row has level {missing}" if missing else "",
                              f"rows have levels {unlisted} that are not listed" if unlisted else "") if part))
    return listed
