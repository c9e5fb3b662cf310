"""A mixture's rollout: each source's rows to that source's own rollout, the pieces joined into one batch.

    MixtureRollout   rows split by their SOURCE column → each source's SingleTurnRollout, AgentRollout
                     or ProgramRollout (built from the source's config, config/mixture.py) → join_rollouts

A batch holds whole groups of several sources (the sampler allocates them by weight, data/sampler.py);
each source's rows go to its rollout in one call, and the scored pieces are joined (prompts padded to
the widest; a column one kind of rollout makes and another does not, e.g. an episode's transcript, is
empty on the other's rows). What is decided across a training batch (group filtering, reward
normalisation) is each source's own, over its own rows: rewards of different environments are not
normalised against each other. Each source's resources (retriever, Env-LLM client, tool hosts,
OpenEnv sessions, the judge) are opened once, when the run opens its rollout.

Metrics: the sources' own merge by their rules (``reward/errors`` of all sources is one count, which
the circuit breakers read), and each source's samples, mean score and accuracy are logged as
``mixture/<name>/samples``, ``.../score``, ``.../acc``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from posttrain import keys
from posttrain.agents.env import EpisodeSample
from posttrain.config.mixture import MixtureSource
from posttrain.config.schema import PosttrainConfig
from posttrain.metrics import Metrics, mean, merge, total
from posttrain.protocol import Batch
from posttrain.rollout.batching import join_rollouts, sample_accuracy
from posttrain.rollout.roles import RolloutRoles


class MixtureRollout:
    """The sources' rollouts behind one rollout's interface; rows go to the rollout of their ``SOURCE``."""

    def __init__(self, sources: list[MixtureSource], build: Callable[[MixtureSource], Any], pad_token_id: int) -> None:
        """``build(source)``: the source's own rollout (``rollout.build_rollout`` on its config)."""
        self.sources = sources
        self.parts = {source.name: build(source) for source in sources}
        self.pad_token_id = pad_token_id
        self.first_failures: dict[str, str] = {}
        self.stop_strings = tuple(dict.fromkeys(s for part in self.parts.values() for s in part.stop_strings))

    def check_data(self, **datasets: Any) -> None:
        """Each source's rows checked by its own rollout (the prompts its environment cannot play, the rows
        its score functions cannot score), before any worker starts."""
        for name, part in self.parts.items():
            part.check_data(**{split: _rows_of(dataset, name) for split, dataset in datasets.items()})

    def open(self, roles: RolloutRoles) -> None:
        opened = []
        try:
            for part in self.parts.values():
                part.open(roles)
                opened.append(part)
        except BaseException:
            for part in opened:
                part.close()
            raise

    def before_training(self, samples: Iterable[EpisodeSample]) -> None:
        """Each environment's own check before step 1, on its source's rows (``EpisodeSample.source``)."""
        rows = list(samples)
        for name, part in self.parts.items():
            part.before_training([row for row in rows if row.source == name])

    def close(self) -> None:
        for part in self.parts.values():
            part.close()

    def __call__(self, roles: RolloutRoles, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None,
                 whole_batch: bool = True) -> tuple[Batch, Metrics]:
        """Each source's rows through its rollout, the pieces joined back in the batch's order of prompts."""
        timings = {} if timings is None else timings
        pieces, metrics, self.first_failures = [], [], {}
        for name, rows in self._split(batch).items():
            part_timings: dict[str, float] = {}
            piece, part_metrics = self.parts[name](roles, _prompts_of(batch, rows), validate=validate, timings=part_timings, whole_batch=False)
            for phase, seconds in part_timings.items():
                timings[phase] = timings.get(phase, 0.0) + seconds
            self.first_failures |= {f"{kind} ({name})": note for kind, note in self.parts[name].first_failures.items()}
            pieces.append(piece)
            metrics.append(part_metrics | source_metrics(name, piece))
        joined, merged = self._join(pieces, batch), merge(metrics)
        if validate or not whole_batch:
            return joined, merged
        return self.finish_batch(joined, merged)

    def finish_batch(self, batch: Batch, metrics: Metrics) -> tuple[Batch, Metrics]:
        """Each source's own decisions over its own rows (group filtering, reward normalisation), then joined."""
        pieces, merged = [], [metrics]
        for name, rows in self._split(batch).items():
            piece, piece_metrics = self.parts[name].finish_batch(batch.index(rows), {})
            pieces.append(piece)
            merged.append(piece_metrics)
        joined = self._join(pieces, batch)
        joined.meta = dict(batch.meta)
        return joined, merge(merged)

    def _split(self, batch: Batch) -> dict[str, np.ndarray]:
        """Row indices per source, in the mixture's order (a group's rows share a source: they stay together)."""
        if keys.SOURCE not in batch:
            raise ValueError("a mixture's rows carry their source (the SOURCE column the mixture's loader writes); this batch has none")
        names = np.asarray(batch[keys.SOURCE], dtype=object)
        unknown = sorted(set(names.tolist()) - set(self.parts))
        if unknown:
            raise ValueError(f"rows of sources {unknown}, which this mixture does not have ({sorted(self.parts)})")
        return {name: np.flatnonzero(names == name) for name in self.parts if (names == name).any()}

    def _join(self, pieces: list[Batch], batch: Batch) -> Batch:
        """The pieces as one batch in ``batch``'s order of prompts (each group where its prompt was, so that its
        GROUP_IDS still number the prompts: ReMax's baseline reads them so), prompts padded to the widest, the
        oldest weights."""
        versions = [piece.meta.get(keys.WEIGHT_VERSION) for piece in pieces if keys.WEIGHT_VERSION in piece.meta]
        counts = [piece.meta.get(keys.GROUP_COUNT) for piece in pieces]
        joined = pieces[0] if len(pieces) == 1 else join_rollouts(pieces, self.pad_token_id)
        first = {}
        for row, uid in enumerate(batch[keys.UID]):
            first.setdefault(uid, row)
        order = np.argsort([first[uid] for uid in joined[keys.UID]], kind="stable")  # a program's samples stay together
        joined = joined.index(order)
        if versions:
            joined.meta[keys.WEIGHT_VERSION] = min(versions)
        if all(count is not None for count in counts) and len(pieces) > 1:
            joined.meta[keys.GROUP_COUNT] = sum(counts)
        return joined


def _prompts_of(batch: Batch, rows: np.ndarray) -> Batch:
    """Prompt rows ``rows`` of ``batch``, left padding cut to their own longest prompt (as the loader pads a batch)."""
    part = batch.index(rows)
    width = int(part[keys.PROMPT_MASK].sum(-1).max())
    part.tensors[keys.PROMPT_IDS] = part[keys.PROMPT_IDS][:, -width:]
    part.tensors[keys.PROMPT_MASK] = part[keys.PROMPT_MASK][:, -width:]
    return part


def source_metrics(name: str, piece: Batch) -> Metrics:
    """A source's samples, mean score and accuracy in a scored piece (``mixture/<name>/...``)."""
    if not len(piece):
        return {}
    scores = piece[keys.TOKEN_SCORES].sum(-1)
    return {
        f"mixture/{name}/samples": total(len(piece)),
        f"mixture/{name}/score": mean(float(scores.mean()), len(piece)),
        f"mixture/{name}/acc": mean(float(np.mean(sample_accuracy(piece))), len(piece)),
    }


def _rows_of(dataset: Any, name: str) -> Any:
    """``dataset`` (an RLDataset) with only the rows of source ``name``; None stays None."""
    return None if dataset is None else dataset.with_samples([sample for sample in dataset.samples if sample.source == name])


def rollout_parts(rollout: Any, config: PosttrainConfig | None) -> list[tuple[str | None, PosttrainConfig | None, Any]]:
    """(source name, its config, its rollout) for each source of a mixture's rollout; ``[(None, config, rollout)]``
    for any other: what reads the rollout's own pieces (a judge's check, the retrievers it opened) asks this."""
    if isinstance(rollout, MixtureRollout):
        return [(source.name, source.config, rollout.parts[source.name]) for source in rollout.sources]
    return [(None, config, rollout)]


def source_dirs(data_dir: Path | Mapping[str, Path] | None, sources: list[MixtureSource]) -> dict[str, Path | None]:
    """Each source's data directory (where a search corpus may sit): ``data_dir`` by name, for a mixture."""
    if isinstance(data_dir, Mapping):
        return {source.name: data_dir.get(source.name) for source in sources}
    return {source.name: data_dir for source in sources}


