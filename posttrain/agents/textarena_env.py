"""Text games of TextArena (``textarena==0.7.4``) as an agent environment: the library's own game objects, unchanged.

    env.name: textarena
    env.options: {id: GuessTheNumber-v0, kwargs: {max_number: 10, max_turns: 5}}
    # a curriculum over game sizes: rows may also deal the games of these keyword arguments
    env.options: {id: GuessTheNumber-v0, kwargs: {max_number: 10, max_turns: 5},
                  levels: [{max_number: 4, max_turns: 3}, {max_number: 10, max_turns: 5}]}

One episode is one game, played by the agent alone:

- **Start.** ``textarena.make(id, **kwargs)`` builds the game as the library registers it (its wrappers
  included), and ``reset(num_players=1, seed=SEED)`` starts it, where ``SEED`` comes from the dataset row
  (``posttrain prepare textarena``), so a held-out set of seeds is a fixed set of games. The row's prompt
  is the game's opening observation; ``reset`` checks that the library still opens the game with it.
- **A turn is a move.** The agent turn's text goes to the game's ``step(action)`` as it is: the game
  parses it (``[5]`` in GuessTheNumber), and the wrappers the library registers with the id apply (its
  ``ActionFormattingWrapper`` brackets an action that has no brackets).
- **The observation is what is new.** The library hands each message to a player once (the innermost
  game's ``get_observation()``); posttrain shows the messages of this move, one line each as the library's
  ``LLMObservationWrapper`` writes them (``[GAME] The target number is higher.``), without the echo of the
  agent's own move, which its context already holds. The library's observation wrappers, which rebuild
  the whole history for agents that keep none, are not read: the conversation is the history.
- **Reward.** TextArena gives a reward only when a game ends (``close()`` returns ``{player: reward}``;
  its ``step`` returns none): it lands on the turn that ended the game, and every other turn gets 0. A game
  that posttrain's turn budget (``env.max_turns``) cut before it ended has no reward from the library
  and scores 0 (counted as ``env/unfinished``). ``info.valid`` is the library's own verdict (its error
  counter); ``success`` is the library's win, a reward of 1.

**Levels.** A row names its game whole (id, keyword arguments, seed: ``posttrain prepare textarena``), and
the episode plays that game. Rows of other sizes than ``kwargs`` are accepted when ``levels`` lists their
keyword arguments (the preparer's ``levels`` option writes such rows, ``extra_info.level`` their level, for
``data.sampler.curriculum``); any other row is refused before any worker starts, so data prepared for
another game never trains silently.

**Which games.** One-player games that start offline: :data:`OFFLINE_GAMES`, each of whose registered
ids was made and reset with the network blocked and gave a ``SinglePlayerState``, the same opening for
the same seed (``tests/agents/test_textarena_env.py`` checks it again). The rest are refused when the
environment is built (``posttrain config`` and the check before any worker starts): the games in
:data:`NEEDS_NETWORK` download nltk's corpora or ask a remote model (OpenRouter) when they start;
the others need two or more players, or do not start under this Python (``Klondike``, ``UltimateTexasHoldem``:
syntax errors in the library).

**Randomness.** A TextArena game seeds Python's global ``random`` in ``reset`` and draws from it while it
plays (2048's new tiles). Episodes of a batch play turn about in one process, so each game gets a
stream of its own: the global state is swapped in around each of the game's calls. An episode then plays
exactly as the same seed and moves played alone, and the rest of the process keeps its own stream.
"""

from __future__ import annotations

import difflib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from posttrain.agents.env import Environment, EpisodeSample, StepInfo, StepResult
from posttrain.errors import InputError, import_optional

PLAYER = 0  # the agent: the only player of a one-player game
INSTALL_HINT = 'pip install "textarena==0.7.4" (posttrain\'s envs extra: pip install "posttrain[envs]", or -e ".[envs]" from a checkout)'
# the packages (textarena.envs.<Game>) of the one-player games that start offline (module docstring)
OFFLINE_GAMES = frozenset({
    "Bandit", "Blackjack", "Countdown", "Crosswords", "Cryptarithm", "FifteenPuzzle", "FrozenLake", "Game2048",
    "GuessTheNumber", "LightsOut", "LogicPuzzle", "Mastermind", "Minesweeper", "PegJump", "RushHour", "Secretary",
    "Set", "Slitherlink", "Sokoban", "Sudoku", "ThreeCardMonte", "TowerOfHanoi",
})
_WORDS = "downloads nltk's `words` corpus when a game starts"
_REMOTE = "asks a remote model through OpenRouter (OPENROUTER_API_KEY)"
NEEDS_NETWORK = {
    "Hangman": _WORDS, "Wordle": _WORDS, "WordLadder": _WORDS, "WordSearch": _WORDS, "WordChains": _WORDS,
    "Codenames": _WORDS, "GuessWho": _REMOTE, "TwentyQuestions": _REMOTE, "Debate": _REMOTE,
}


def library(module: str = "textarena") -> Any:
    """The library's ``module``, imported on first use (importing it takes seconds)."""
    return import_optional(module, package="textarena", hint=INSTALL_HINT,
                           needed_by="env.name=textarena and `posttrain prepare textarena` play TextArena's own games")


def offline_ids() -> list[str]:
    """Every registered id of the games in :data:`OFFLINE_GAMES`."""
    registry = library("textarena.envs.registration").ENV_REGISTRY
    return sorted(game_id for game_id in registry if _package(registry[game_id].entry_point) in OFFLINE_GAMES)


def check_game(game_id: str) -> None:
    """Raise InputError unless ``game_id`` is a registered id of a game posttrain plays (module docstring)."""
    registry = library("textarena.envs.registration").ENV_REGISTRY
    if game_id not in registry:
        close = difflib.get_close_matches(game_id, list(registry), n=3)
        raise InputError(f"id={game_id!r} is not a TextArena {_version()} game{f' (did you mean {close}?)' if close else ''}; "
                         f"posttrain plays the one-player games that start offline: {', '.join(sorted(OFFLINE_GAMES))} (their ids: "
                         "python -c 'from posttrain.agents.textarena_env import offline_ids; print(offline_ids())')")
    game = _package(registry[game_id].entry_point)
    if game in NEEDS_NETWORK:
        raise InputError(f"id={game_id!r}: {game} {NEEDS_NETWORK[game]}, which a training run does not do "
                         "(runs are offline and repeatable); choose a game that starts offline, e.g. GuessTheNumber-v0")
    if game not in OFFLINE_GAMES:
        raise InputError(f"id={game_id!r}: posttrain plays TextArena's one-player games that start offline ({', '.join(sorted(OFFLINE_GAMES))}); "
                         f"{game} is not one of them (it needs two or more players, or does not start under this Python)")


def make_game(game_id: str, kwargs: Mapping[str, Any], option: str = "kwargs") -> Any:
    """``textarena.make(game_id, **kwargs)``, after :func:`check_game`; keyword arguments the game refuses are an
    InputError naming ``option`` (where they were given: ``kwargs``, ``levels[1]``)."""
    check_game(game_id)
    try:
        return library().make(game_id, **kwargs)
    except TypeError as error:
        raise InputError(f"{option}={dict(kwargs)}: TextArena's {game_id} does not take them ({error}); "
                         "give the keyword arguments of its game class, e.g. {max_number: 10} for GuessTheNumber") from None
    except Exception as error:  # noqa: BLE001 - a game's constructor raises what it likes (an assert, a missing file) for a value it refuses
        raise InputError(f"{option}={dict(kwargs)}: TextArena's {game_id} refuses them ({type(error).__name__}: {error}); "
                         "give values its game class accepts") from None


def normalise_levels(levels: Sequence[Mapping[str, Any]] | str | None) -> list[dict[str, Any]]:
    """``levels``, each level's game keyword arguments, as plain JSON mappings (JSON text of a list from
    the command line, a list from YAML); refused unless at least two differ."""
    if levels is None or levels == "":
        return []
    try:
        value = json.loads(levels) if isinstance(levels, str) else list(levels)
    except (TypeError, ValueError) as error:
        raise InputError(f"levels={levels!r} is not a JSON list ({error}); give each level's keyword arguments, "
                         'e.g. [{"max_number": 4}, {"max_number": 10}]') from None
    if not isinstance(value, list):
        raise InputError(f"levels={levels!r} must be a list of each level's keyword arguments, e.g. [{{\"max_number\": 4}}, {{\"max_number\": 10}}]")
    found = [normalise_kwargs(level) for level in value]
    distinct = {json.dumps(level, sort_keys=True) for level in found}
    if len(distinct) < 2 or len(distinct) != len(found):
        raise InputError(f"levels={levels!r}: a curriculum needs at least two levels, each with other keyword arguments")
    return found


def normalise_kwargs(kwargs: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """``kwargs`` as a plain JSON mapping (JSON text from the command line, a mapping from YAML)."""
    if kwargs is None or kwargs == "":
        return {}
    try:
        value = json.loads(kwargs) if isinstance(kwargs, str) else json.loads(json.dumps(dict(kwargs)))
    except (TypeError, ValueError) as error:
        raise InputError(f"kwargs={kwargs!r} is not a JSON mapping ({error}); give e.g. {{\"max_number\": 10}}") from None
    if not isinstance(value, dict):
        raise InputError(f"kwargs={kwargs!r} must be a mapping of the game's keyword arguments, e.g. {{\"max_number\": 10}}")
    return value


@dataclass(frozen=True)
class GameRef:
    """One game of a dataset row: its id, the game's keyword arguments and the seed of its ``reset``."""

    id: str
    seed: int
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "kwargs": self.kwargs, "seed": self.seed}, sort_keys=True)

    @classmethod
    def from_json(cls, text: Any) -> GameRef:
        try:
            value = json.loads(text)
            return cls(str(value["id"]), int(value["seed"]), dict(value.get("kwargs") or {}))
        except (TypeError, ValueError, KeyError, AttributeError):
            raise ValueError(f"ground_truth {text!r} is not a TextArena game: expected JSON text {{\"id\": ..., \"kwargs\": {{...}}, "
                             "\"seed\": N}, as `posttrain prepare textarena` writes it") from None


class Game:
    """One TextArena game object, played through the library's calls with its own stream of ``random``."""

    def __init__(self, game_id: str, kwargs: Mapping[str, Any]) -> None:
        self.id, self.kwargs = game_id, dict(kwargs)
        self.wrapped = make_game(game_id, self.kwargs)
        self.base = self.wrapped
        while isinstance(self.base, library().Wrapper):
            self.base = self.base.env
        self._random_state = random.getstate()
        self.done = False

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int) -> str:
        """Start the game with ``seed``; returns its opening observation."""
        with self._own_random():
            self.wrapped.reset(num_players=1, seed=seed)
        if not isinstance(self.base.state, library().SinglePlayerState):
            raise InputError(f"TextArena's {self.id} started a {type(self.base.state).__name__}: posttrain plays one-player games only")
        return self.new_messages()

    def step(self, action: str) -> bool:
        """Play ``action``; whether the game is over."""
        with self._own_random():
            self.done, _ = self.wrapped.step(action)
        return self.done

    def new_messages(self) -> str:
        """The messages the game sent the agent since the last call, less the echo of its own move."""
        with self._own_random():
            _, messages = self.base.get_observation()
        roles = self.base.state.role_mapping
        return "\n".join(f"[{roles.get(sender, f'Player {sender}')}] {text}" for sender, text, kind in messages
                         if not (sender == PLAYER and kind == library().ObservationType.PLAYER_ACTION))

    def move_was_valid(self) -> bool:
        """The library's verdict on the last move: its SinglePlayerState counts invalid moves until a valid one."""
        return self.base.state.error_count == 0 and not self.base.state.game_info[PLAYER]["invalid_move"]

    def close(self) -> float | None:
        """The library's ``close()``: the agent's reward when the game is over, else None."""
        with self._own_random():
            rewards, _ = self.wrapped.close()
        return None if not rewards else float(rewards[PLAYER])


def _of_the_game(sample: EpisodeSample, game_id: str, allowed: Sequence[Mapping[str, Any]]) -> GameRef:
    """The row's game, refused unless it is ``game_id`` with one of the ``allowed`` keyword arguments (the
    run's ``env.options``: ``kwargs``, and each of ``levels``)."""
    ref = GameRef.from_json(sample.ground_truth)
    if ref.id != game_id or ref.kwargs not in [dict(kwargs) for kwargs in allowed]:
        said = " or ".join(str(dict(kwargs)) for kwargs in allowed)
        raise InputError(f"a row holds game {ref.id} with kwargs {ref.kwargs}, but env.options say {game_id} with "
                         f"{said}; prepare the data with the same id and kwargs (posttrain prepare textarena), or list "
                         "the row's kwargs in env.options.levels")
    return ref


def _allowed(options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The keyword arguments a row's game may have under ``options``: ``kwargs``, then each of ``levels``."""
    return [normalise_kwargs(options.get("kwargs")), *normalise_levels(options.get("levels"))]


class TextArenaEnv(Environment):
    """One TextArena game per episode (module docstring)."""

    name = "textarena"
    counters = ("invalid_moves", "wins", "unfinished")

    def __init__(self, id: str, kwargs: Mapping[str, Any] | str | None = None,  # noqa: A002 - TextArena's word
                 levels: Sequence[Mapping[str, Any]] | str | None = None) -> None:
        self.allowed = _allowed({"kwargs": kwargs, "levels": levels})
        self.game = Game(id, self.allowed[0])
        for index, level in enumerate(self.allowed[1:]):
            make_game(id, level, f"levels[{index}]")  # each level's arguments are the game's, checked before any episode

    @classmethod
    def check_sample(cls, sample: EpisodeSample, options: Mapping[str, Any]) -> None:
        _of_the_game(sample, str(options.get("id")), _allowed(options))

    def reset(self, sample: EpisodeSample) -> str:
        ref = _of_the_game(sample, self.game.id, self.allowed)
        if ref.kwargs != self.game.kwargs:  # a row of another level: its game
            self.game = Game(ref.id, ref.kwargs)
        opening = self.game.reset(ref.seed)
        shown = sample.prompt[-1]["content"] if sample.prompt else None
        if shown != opening:
            raise InputError(f"the row of {ref.id} seed {ref.seed} does not end with the game's opening as TextArena "
                             f"{_version()} writes it; prepare the data again with this version (posttrain prepare textarena)")
        return ""

    def final_turn_instruction(self) -> str:
        return "This is your last move."

    def step(self, action: str) -> StepResult:
        done = self.game.step(action)
        valid = self.game.move_was_valid()
        counts = {} if valid else {"invalid_moves": 1}
        if not done:
            return StepResult(self.game.new_messages(), 0.0, False, StepInfo(valid=valid, effective=valid, counts=counts))
        reward = self.game.close()
        won = reward is not None and reward >= 1.0
        return StepResult("", reward or 0.0, True, StepInfo(valid=valid, effective=valid, success=won, counts={**counts, "wins": int(won)}))

    def finish(self, action: str) -> StepResult:
        """The last move posttrain's turn budget allows; a game it leaves unfinished scores 0."""
        result = self.step(action)
        if result.done:
            return result
        return StepResult("", 0.0, True, StepInfo(result.info.valid, result.info.effective, counts={**result.info.counts, "unfinished": 1}))


def _package(entry_point: Any) -> str:
    """``Wordle`` of ``textarena.envs.Wordle.env:WordleEnv`` (a class's module when it is not a string)."""
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else entry_point.__module__
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["textarena", "envs"] else module


def _version() -> str:
    return str(library().__version__)
