"""A TextArena game's seeds as RL rows (``posttrain prepare textarena id=GuessTheNumber-v0``).

Each row is one game for the agent environment ``env.name: textarena`` (:mod:`posttrain.agents.textarena_env`):
the library makes the game and starts it with the row's seed, here to write its opening and again in
every episode. Options (``key=value``, as every preparer takes them):

- ``id``: a registered TextArena id of a one-player game that starts offline (others are refused, naming why);
- ``kwargs``: the game's keyword arguments for ``textarena.make(id, **kwargs)``, JSON text
  ``{"max_number": 10, "max_turns": 5}`` (in a preset's ``data.builtin_options`` also a mapping); the run's
  ``env.options.kwargs`` must be the same;
- ``size`` / ``seed``: training games, seeds ``seed .. seed+size-1``;
- ``levels`` (none by default): a curriculum over game sizes, each level's keyword arguments, JSON text of a
  list ``[{"max_number": 4, "max_turns": 3}, {"max_number": 10, "max_turns": 5}]`` (in a preset also a list):
  the training games are ``size`` per level, level ``L``'s from seeds ``seed + L*size``, ``extra_info.level``
  their level (for ``data.sampler.curriculum.key=extra_info.level``); the held-out games keep ``kwargs``. The
  run's ``env.options.levels`` must list the same;
- ``test_size`` / ``test_seed``: held-out games, seeds ``test_seed .. test_seed+test_size-1``; the two
  ranges must not meet (refused otherwise). A small game has few distinct games (GuessTheNumber from 1 to
  10 has ten secrets), so a held-out seed can deal a game that a training seed deals too: its hidden state
  is the game's, and posttrain does not look at it.

Files: ``train.parquet`` and ``test.parquet``, one row per seed: the prompt is the game's opening
observation as the environment shows it (one user message); ``ground_truth`` is the game's reference
(:class:`~posttrain.agents.textarena_env.GameRef`, JSON text ``{"id", "kwargs", "seed"}``); ``data_source``
is ``textarena``, ``ability`` ``game``; ``extra_info`` holds ``split``, ``index``, ``game`` and ``seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.agents.textarena_env import Game, GameRef, make_game, normalise_kwargs, normalise_levels
from posttrain.data.format import make_row, write_rows
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError
from posttrain.rewards.textarena_outcomes import DATA_SOURCE


def prepare_textarena(
    out_dir: Path,
    *,
    id: str,  # noqa: A002 - TextArena's word, as in env.options.id
    kwargs: str | dict[str, Any] | None = None,
    size: int = 256,
    seed: int = 0,
    test_size: int = 64,
    test_seed: int = 1_000_000,
    levels: str | list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Write the files of the module docstring into ``out_dir``; returns their paths."""
    level_kwargs, game_kwargs = checked_options(dict(locals()))
    out_dir = Path(out_dir)
    train = [_row(GameRef(id, seed + level * size + index, level_game), "train", level * size + index, level if level_kwargs else None)
             for level, level_game in enumerate(level_kwargs or [game_kwargs]) for index in range(size)]
    test = [_row(GameRef(id, test_seed + index, game_kwargs), "test", index) for index in range(test_size)]
    return [write_rows(train, out_dir / "train.parquet"), write_rows(test, out_dir / "test.parquet")]


def checked_options(given: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(each level's game keyword arguments, the held-out games' ones) from prepare_textarena's arguments, once every
    refusal they call for alone has passed: seeds, the game, and keyword arguments the game takes (also
    ``preparers.check_options``'s: a run or a recipe refuses them before it prepares anything)."""
    size, seed, test_size, test_seed = given["size"], given["seed"], given["test_size"], given["test_seed"]
    check_counts(1, size=size, test_size=test_size)
    level_kwargs = normalise_levels(given["levels"])
    trained = size * max(1, len(level_kwargs))  # training seeds
    if seed < test_seed + test_size and test_seed < seed + trained:
        raise InputError(f"seed={seed} size={size}{f' levels={len(level_kwargs)}' if level_kwargs else ''} and test_seed={test_seed} "
                         f"test_size={test_size} overlap: the training games use seeds {seed}..{seed + trained - 1} and the held-out "
                         f"ones {test_seed}..{test_seed + test_size - 1}; pass test_seed >= {seed + trained}")
    game_kwargs = normalise_kwargs(given["kwargs"])
    make_game(given["id"], game_kwargs)  # the game's own constructor refuses keyword arguments it does not take
    for index, level in enumerate(level_kwargs):
        make_game(given["id"], level, f"levels[{index}]")
    return level_kwargs, game_kwargs


def _row(ref: GameRef, split: str, index: int, level: int | None = None) -> dict[str, Any]:
    opening = Game(ref.id, ref.kwargs).reset(ref.seed)
    extra = {"split": split, "index": index, "game": ref.id, "seed": ref.seed}
    return make_row(DATA_SOURCE, [{"role": "user", "content": opening}], ref.to_json(), "game",
                    extra if level is None else extra | {"level": level})
