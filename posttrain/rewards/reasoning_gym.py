"""reasoning-gym's own scorers as the score function of data_source ``reasoning_gym``.

reasoning-gym (PyPI ``reasoning-gym==0.1.25``, Apache-2.0) is a library of about 100 procedural task
generators (``chain_sum``, ``leg_counting``, ``spell_backward``, ...), each with its own
``score_answer(answer, entry)``. This module is the adapter to it: a row names one of the library's
items, and the library regenerates that item and scores the answer; nothing of a task's generation or
scoring is re-implemented here (STYLE.md 16).

**What a row holds.** ``ground_truth`` is the JSON text of an :class:`ItemRef`: the task, its config
(the fields given to the task's config class; the library's defaults fill the rest), the seed and
size the dataset was created with, the item's index, and the SHA-256 of its question. The item is
``reasoning_gym.create_dataset(task, seed=seed, size=size, **config)[index]`` (the library draws
item ``i`` of seed ``s`` from ``random.Random(s + i)``); the hash catches a library whose generator
has changed since the row was written, which would otherwise be scored against another question.

**How an answer is read and scored**, as the library's own training examples do: the answer is
``reasoning_gym.utils.extract_answer(response)`` (the text of the last ``<answer>...</answer>``; None
without one), and the score is the task's ``score_answer(answer, entry)`` as it returns it, partial
credit included (``spell_backward`` credits each letter in place, ``chain_sum`` an answer that holds the
right number among other text). The library's system prompts (``reasoning_gym.utils.SYSTEM_PROMPTS``)
ask for that tag; ``posttrain prepare reasoning-gym`` puts one into each row.

:func:`compute_score` returns ``{"score", "acc", "format"}``: the library's score; 1.0 when that is
full credit; 1.0 when an answer tag was found. Datasets are regenerated once per process for each
(task, config, seed, size) and kept (:func:`dataset`). The library is imported when first needed;
without it, :class:`MissingLibraryError` says how to install it.

The registry's entry is :data:`SCORE_FUNCTION`, which calls :func:`compute_score` and, unpickled, imports
the library: importing it takes seconds, and the scoring child process (``posttrain/deadlines.py``) loads its
functions by unpickling them, under its own deadline, so no sample's deadline pays for the import (a
sample that timed out restarts the child, and would pay it again). Any other process imports nothing
until it scores.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.errors import InputError, MissingLibraryError, import_optional

DATA_SOURCE = "reasoning_gym"
RG_PIN = "reasoning-gym==0.1.25"
INSTALL_HINT = f'pip install "{RG_PIN}" (posttrain\'s envs extra: pip install "posttrain[envs]", or -e ".[envs]" from a checkout)'


def library(module: str = "reasoning_gym") -> Any:
    """The library's ``module`` (``reasoning_gym``, ``reasoning_gym.utils``), imported on first use."""
    return import_optional(module, package="reasoning-gym", hint=INSTALL_HINT,
                           needed_by=f"data_source {DATA_SOURCE!r} and `posttrain prepare reasoning-gym` use reasoning-gym's own generators and scorers")


def task_names() -> list[str]:
    """Every task the installed library registers (``create_dataset``'s names)."""
    return sorted(library("reasoning_gym.factory").DATASETS)


def question_hash(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ItemRef:
    """One item of the library: enough to regenerate it (module docstring)."""

    task: str
    seed: int
    size: int
    index: int
    config: dict[str, Any] = field(default_factory=dict)
    question_sha256: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ItemRef:
        try:
            fields = json.loads(text)
            return cls(task=fields["task"], seed=int(fields["seed"]), size=int(fields["size"]), index=int(fields["index"]),
                       config=dict(fields.get("config") or {}), question_sha256=fields.get("question_sha256", ""))
        except (TypeError, ValueError, KeyError) as error:
            raise InputError(
                f"ground truth {text!r:.120} is not a reasoning-gym item reference ({error}); a {DATA_SOURCE} row's "
                "ground_truth is JSON text {task, config, seed, size, index}, as `posttrain prepare reasoning-gym` writes it") from None


def dataset(task: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """The library's dataset ``create_dataset(task, seed=seed, size=size, **config)``, made once per process."""
    return _dataset(task, json.dumps(config, sort_keys=True), seed, size)


@functools.lru_cache(maxsize=64)
def _dataset(task: str, config_json: str, seed: int, size: int) -> Any:
    rg = library()
    if task not in rg.factory.DATASETS:
        raise InputError(f"reasoning-gym {installed_version()} has no task {task!r}; its tasks are: {', '.join(task_names())}")
    config = json.loads(config_json)
    try:
        return rg.create_dataset(task, seed=seed, size=size, **config)
    except TypeError as error:  # a field the task's config class does not have
        fields = [name for name in rg.factory.DATASETS[task][1].__dataclass_fields__ if name not in ("seed", "size")]
        raise InputError(f"reasoning-gym task {task!r}: config {config} ({error}); its config fields are {fields}") from None
    except (AssertionError, ValueError) as error:  # the config class's own validate()
        raise InputError(f"reasoning-gym task {task!r} refuses config {config}: {error or 'a check failed'}") from None


def regenerate(item: ItemRef) -> dict[str, Any]:
    """The library's entry (``question``, ``answer``, ``metadata``) for ``item``; InputError if its
    question is not the one the row was written from."""
    entry = dataset(item.task, item.config, item.seed, item.size)[item.index]
    if item.question_sha256 and question_hash(entry["question"]) != item.question_sha256:
        raise InputError(
            f"reasoning-gym {installed_version()} regenerates another question for {item.task} seed {item.seed} index "
            f"{item.index} than the row was written from; write the data again with `posttrain prepare reasoning-gym` "
            f"under this version, or install the one it was written with ({RG_PIN} for posttrain's own presets)")
    return entry


def installed_version() -> str:
    return importlib.metadata.version("reasoning-gym")


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **_: Any) -> dict[str, float]:
    """``{"score", "acc", "format"}`` for one response: the task's own ``score_answer`` on the answer
    the library's ``extract_answer`` reads from ``solution_str`` (module docstring)."""
    item = ItemRef.from_json(ground_truth)
    entry = regenerate(item)
    answer = library("reasoning_gym.utils").extract_answer(solution_str)
    score = float(dataset(item.task, item.config, item.seed, item.size).score_answer(answer, entry))
    return {"score": score, "acc": float(score == 1.0), "format": float(answer is not None)}


class _PreloadingScorer:
    """:func:`compute_score`, pickled as "import the library, then this" (module docstring)."""

    def __call__(self, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **_: Any) -> dict[str, float]:
        return compute_score(solution_str, ground_truth, extra_info)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _preloaded_scorer, ()

    def __repr__(self) -> str:
        return f"{__name__}.compute_score"


def _preloaded_scorer() -> _PreloadingScorer:
    try:
        library()
    except MissingLibraryError:  # each call says so: a load error would fail the batch's other data sources too
        pass
    return SCORE_FUNCTION


SCORE_FUNCTION = _PreloadingScorer()

__all__ = ["DATA_SOURCE", "INSTALL_HINT", "RG_PIN", "SCORE_FUNCTION", "ItemRef", "compute_score", "dataset",
           "installed_version", "library", "question_hash", "regenerate", "task_names"]
