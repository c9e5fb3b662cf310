"""TextArena's games through posttrain's agent loop, against the same games played on the library directly:
a scripted policy (not a model) earns exactly the library's reward, sees only what is new, and episodes
played side by side play as they would alone; games that need the network are refused, saying why."""

from __future__ import annotations

import json
import random
import re
import socket

import pyarrow.parquet as pq
import pytest
from tests.optional import require

require("textarena", 'textarena is installed by scripts/setup.sh (pip install -e ".[envs]")')

import textarena  # noqa: E402

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, TurnOutput, run_episodes  # noqa: E402
from posttrain.rollout.environments import load_env_class, probe_environment  # noqa: E402
from posttrain.agents.textarena_env import TextArenaEnv, offline_ids  # noqa: E402
from posttrain.data.preparers import parse_options, prepare  # noqa: E402
from posttrain.errors import InputError  # noqa: E402

GUESS = {"id": "GuessTheNumber-v0", "kwargs": {"max_number": 10, "max_turns": 5}}
# "[0]" is out of range (the game's warning), "4" is bracketed by the library's ActionFormattingWrapper;
# then ascending guesses: a secret up to 5 is found, a larger one ends the game at its turn limit
GUESS_MOVES = ["[0]", "[1]", "[2]", "I think it is [3]", "4", "[5]", "[6]", "[7]"]
TILES = {"id": "2048-v0-ultra-easy", "kwargs": {}}
TILE_MOVES = ["[Up]", "[Left]", "[Down]", "[Right]"]


def scripted_policy(tokenizer, moves: list[str]):
    """The agent loop's generate function: each episode's n-th turn is ``moves[n]`` (cycling), read from its context."""
    def generate(contexts, max_new_tokens, stop, request_keys):
        outputs = []
        for context in contexts:
            made = tokenizer.decode(context).count("<|im_start|>assistant") - 1
            tokens = tokenizer.encode(moves[made % len(moves)], add_special_tokens=False) + [tokenizer.eos_token_id]
            outputs.append(TurnOutput(tokens, [-0.5] * len(tokens), "stop"))
        return outputs
    return generate


def prepared_rows(tmp_path, game: dict, size: int) -> list[dict]:
    options = parse_options("textarena", [f"id={game['id']}", f"kwargs={json.dumps(game['kwargs'])}", f"size={size}", "seed=0", "test_size=1"])
    train, _ = prepare("textarena", tmp_path, **options)
    return pq.read_table(train).to_pylist()


def play_in_loop(tokenizer, game: dict, rows: list[dict], moves: list[str], max_turns: int):
    samples = [EpisodeSample(r["prompt"], r["reward_model"]["ground_truth"], r["data_source"], r["extra_info"]) for r in rows]
    prompts = [list(tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True, return_dict=False)) for s in samples]
    envs = [TextArenaEnv(**game) for _ in rows]
    config = AgentLoopConfig(max_response_length=20000, max_turns=max_turns, max_turn_tokens=32, max_obs_length=4000)
    return run_episodes(envs, samples, prompts, scripted_policy(tokenizer, moves), ObservationRenderer(tokenizer), config)


def play_directly(game: dict, seed: int, actions: list[str]) -> tuple[float | None, list[str]]:
    """The game alone on the library: its reward, and its own LLMObservationWrapper's full history after
    reset and after each move (``textarena.make``'s default wrappers)."""
    env = textarena.make(game["id"], **game["kwargs"])
    env.reset(num_players=1, seed=seed)
    histories = [env.get_observation()[1]]
    for action in actions:
        done, _ = env.step(action)
        histories.append(env.get_observation()[1])
        if done:
            break
    rewards, _ = env.close()
    return (None if rewards is None else rewards[0]), histories


@pytest.fixture(scope="module")
def guess_games(tmp_path_factory, tokenizer):
    rows = prepared_rows(tmp_path_factory.mktemp("guess"), GUESS, size=8)
    return rows, play_in_loop(tokenizer, GUESS, rows, GUESS_MOVES, max_turns=9)


def test_the_loop_earns_exactly_the_librarys_reward_for_the_same_seed_and_moves(guess_games):
    rows, episodes = guess_games
    rewards = []
    for row, episode in zip(rows, episodes):
        reward, _ = play_directly(GUESS, row["extra_info"]["seed"], episode.actions)
        assert episode.reward == reward and episode.turn_rewards[:-1] == [0.0] * (episode.num_turns - 1)
        assert episode.actions[:2] == GUESS_MOVES[:2] and episode.done and not episode.out_of_tokens
        assert episode.counts["invalid_moves"] == 1 and episode.success == (reward == 1.0)
        rewards.append(reward)
    # both ends of the game are played: a found number (1.0) and a turn limit's partial credit
    assert 1.0 in rewards and any(0 < r < 1 for r in rewards)


def test_each_observation_is_only_what_the_move_added(guess_games):
    rows, episodes = guess_games
    for row, episode in zip(rows, episodes):
        _, histories = play_directly(GUESS, row["extra_info"]["seed"], episode.actions)
        assert row["prompt"][-1]["content"] == histories[0].lstrip("\n")
        for i, shown in enumerate(episode.observations):
            added = histories[i + 1][len(histories[i]):]
            assert histories[i + 1].startswith(histories[i])
            # the library's history, less its echo of the agent's own move (the agent's turn holds it)
            assert shown == re.sub(r"\n\[Player\] [^\n]*", "", added).lstrip("\n")
            assert "You are playing Guess The Number" not in shown and shown.startswith("[GAME] ")
    assert any("invalid move" in e.observations[0] for e in episodes)
    assert any("The target number is higher." in o for e in episodes for o in e.observations)


def test_games_played_side_by_side_play_as_they_would_alone(tmp_path, tokenizer):
    """2048 draws its new tiles from Python's global random while it plays: each game keeps its own stream."""
    rows = prepared_rows(tmp_path, TILES, size=3)
    random.seed(123)
    episodes = play_in_loop(tokenizer, TILES, rows, TILE_MOVES, max_turns=60)
    left_at = random.random()
    for row, episode in zip(rows, episodes):
        reward, histories = play_directly(TILES, row["extra_info"]["seed"], episode.actions)
        assert episode.done and episode.reward == (reward or 0.0)
        boards = [h[len(p):] for p, h in zip(histories, histories[1:])]
        assert [re.sub(r"\n\[Player\] [^\n]*", "", b).lstrip("\n") for b in boards[: len(episode.observations)]] == episode.observations
    assert len({tuple(e.observations) for e in episodes}) == len(episodes)
    assert left_at == random.Random(123).random()  # the process's own stream was left where it was


@pytest.mark.parametrize(("game_id", "words"), [
    ("Wordle-v0", "downloads nltk's `words` corpus"),
    ("Hangman-v0", "downloads nltk's `words` corpus"),
    ("TwentyQuestions-v0", "asks a remote model through OpenRouter"),
    ("Chess-v0", "one-player games that start offline"),
    ("GuessTheNumbr-v0", "is not a TextArena 0.7.4 game"),
])
def test_games_that_need_the_network_or_other_players_are_refused_before_the_run(tmp_path, game_id, words):
    with pytest.raises(InputError, match=re.escape(words)):
        probe_environment(load_env_class("textarena"), {"id": game_id})  # what `posttrain config` and preflight run
    with pytest.raises(InputError, match=re.escape(words)):
        prepare("textarena", tmp_path, id=game_id, size=1, test_size=1)


def test_bad_game_arguments_and_rows_of_another_game_are_refused(tmp_path, guess_games):
    with pytest.raises(InputError, match="does not take them.*unexpected keyword argument 'max_numbr'"):
        probe_environment(load_env_class("textarena"), {"id": "GuessTheNumber-v0", "kwargs": {"max_numbr": 10}})
    rows, _ = guess_games
    sample = EpisodeSample(rows[0]["prompt"], rows[0]["reward_model"]["ground_truth"])
    with pytest.raises(InputError, match="env.options say GuessTheNumber-v0 with {'max_number': 20"):
        TextArenaEnv("GuessTheNumber-v0", {"max_number": 20, "max_turns": 5}).reset(sample)
    # the same check on every row before any worker starts, against the run's env.options (kwargs as YAML or JSON text)
    TextArenaEnv.check_sample(sample, {"id": "GuessTheNumber-v0", "kwargs": '{"max_number": 10, "max_turns": 5}'})
    with pytest.raises(InputError, match="env.options say Bandit-v0 with {}"):
        TextArenaEnv.check_sample(sample, {"id": "Bandit-v0"})
    with pytest.raises(InputError, match="does not end with the game's opening"):
        TextArenaEnv(**GUESS).reset(EpisodeSample([{"role": "user", "content": "guess"}], sample.ground_truth))
    with pytest.raises(ValueError, match="is not a TextArena game"):
        TextArenaEnv.check_sample(EpisodeSample([], "42"), GUESS)
    with pytest.raises(InputError, match="overlap"):
        prepare("textarena", tmp_path, id="GuessTheNumber-v0", size=10, seed=0, test_size=5, test_seed=9)


SMALL = {"max_number": 4, "max_turns": 3}


def test_rows_of_each_level_play_their_own_game_size_and_unlisted_sizes_are_refused(tmp_path, tokenizer):
    """A curriculum over game sizes: the preparer's ``levels`` deal training games of each size (held-out
    games keep ``kwargs``); an episode plays its row's game, exactly as the library plays it alone."""
    levels = [SMALL, GUESS["kwargs"]]
    paths = prepare("textarena", tmp_path, **parse_options("textarena", [
        f"id={GUESS['id']}", f"kwargs={json.dumps(GUESS['kwargs'])}", f"levels={json.dumps(levels)}", "size=4", "test_size=2"]))
    train, test = (pq.read_table(path).to_pylist() for path in paths)
    assert [row["extra_info"]["level"] for row in train] == [0] * 4 + [1] * 4
    assert [row["extra_info"]["seed"] for row in train] == list(range(8))  # level L from seed + L*size: no game twice
    assert all(json.loads(row["reward_model"]["ground_truth"])["kwargs"] == levels[row["extra_info"]["level"]] for row in train)
    assert all(json.loads(row["reward_model"]["ground_truth"])["kwargs"] == GUESS["kwargs"] for row in test)
    assert "1 and 4" in train[0]["prompt"][-1]["content"] and "1 and 10" in train[4]["prompt"][-1]["content"]

    game = {**GUESS, "levels": levels}
    episodes = play_in_loop(tokenizer, game, train, GUESS_MOVES, max_turns=9)
    for row, episode in zip(train, episodes):
        played = {"id": GUESS["id"], "kwargs": levels[row["extra_info"]["level"]]}
        assert episode.reward == play_directly(played, row["extra_info"]["seed"], episode.actions)[0]
    assert max(e.num_turns for e in episodes[:4]) <= 5  # the small game's limit: 4 guesses, and the invalid "[0]" uses none
    for row in train:  # every row is one the run's options name, checked before any worker starts
        TextArenaEnv.check_sample(EpisodeSample(row["prompt"], row["reward_model"]["ground_truth"]), game)
    with pytest.raises(InputError, match="or list the row's kwargs in env.options.levels"):
        TextArenaEnv.check_sample(EpisodeSample(train[0]["prompt"], train[0]["reward_model"]["ground_truth"]), GUESS)
    with pytest.raises(InputError, match="at least two levels"):
        TextArenaEnv(GUESS["id"], GUESS["kwargs"], levels=[SMALL, SMALL])
    with pytest.raises(InputError, match="does not take them"):
        TextArenaEnv(GUESS["id"], GUESS["kwargs"], levels=[SMALL, {"max_numbr": 4}])


def test_every_listed_game_starts_offline_as_a_one_player_game_dealt_by_its_seed(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("the network is blocked in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    ids = [game_id for game_id in offline_ids() if not game_id.endswith(("-raw", "-train"))]
    assert "GuessTheNumber-v0" in ids and "Wordle-v0" not in ids and len(ids) > 50
    for game_id in ids:
        openings = []
        for disturb in (1, 2):
            random.seed(disturb)
            env = TextArenaEnv(game_id)
            openings.append(env.game.reset(seed=7))
            assert isinstance(env.game.base.state, textarena.SinglePlayerState), game_id
        assert openings[0] == openings[1] and openings[0], game_id


def test_the_preset_plays_the_game_its_data_deals_and_its_prompts_fit(tmp_path, tokenizer):
    from posttrain.config import load_config, preset_path
    from posttrain.data import RLDataset

    config = load_config([preset_path("textarena_grpo")])
    options = dict(config.data.builtin_options)
    assert (options["id"], dict(options["kwargs"])) == (config.env.options["id"], dict(config.env.options["kwargs"]))
    paths = prepare("textarena", tmp_path, **{**options, "size": 4, "test_size": 2})
    dataset = RLDataset(paths, tokenizer, max_prompt_length=config.data.max_prompt_length, truncation="error")
    assert len(dataset) == 6
    env = TextArenaEnv(**config.env.options)
    rows = pq.read_table(paths[1]).to_pylist()
    assert [r["extra_info"]["seed"] for r in rows] == [options["test_seed"], options["test_seed"] + 1]
    assert env.reset(EpisodeSample(rows[0]["prompt"], rows[0]["reward_model"]["ground_truth"])) == ""
