"""How a TextArena recipe's games ended: each game put in one kind by its own counters (won, lost with every
move valid, lost with invalid moves, unfinished), counted per evaluation with the mean moves, invalid moves and
reward a game, in the recipe's report beside the wins; other data sources' rows left out."""

import json

import pytest

from posttrain.errors import InputError
from posttrain.recipes import EPISODES, load_recipe
from posttrain.recipes.table import recipe_table
from posttrain.rewards.textarena_outcomes import LOST_INVALID, UNFINISHED, outcome, outcomes_markdown

# (wins, invalid moves, unfinished, moves, reward) per game
BASE = [(1, 0, 0, 3, 1.0), (0, 2, 0, 2, 0.5), (0, 1, 0, 6, 0.75), (0, 0, 0, 6, 0.35)]
RL = [(1, 0, 0, 2, 1.0), (1, 1, 0, 4, 1.0), (1, 0, 0, 3, 1.0), (0, 0, 1, 12, 0.0)]


def write_games(directory, games, other_rows=()):
    directory.mkdir()
    lines = [json.dumps(row) for row in other_rows]
    for seed, (wins, invalid, unfinished, moves, reward) in enumerate(games):
        lines.append(json.dumps({
            "data_source": "textarena", "ground_truth": json.dumps({"id": "GuessTheNumber-v0", "seed": seed}),
            "messages": [{"role": "user", "content": f"game {seed}"}, {"role": "assistant", "content": "[5]"}],
            "success": bool(wins), "reward": reward, "extra_info": {"seed": seed},
            "stats": {"wins": float(wins), "invalid_moves": float(invalid), "unfinished": float(unfinished), "num_turns": float(moves)}}))
    (directory / EPISODES).write_text("\n".join(lines) + "\n")
    return directory


def body(markdown: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| |")
            for cells in [[cell.strip() for cell in line.strip().strip("|").split("|")]]}


def test_each_game_is_counted_by_how_it_ended_with_the_means_a_game(tmp_path):
    gsm8k = {"data_source": "gsm8k", "ground_truth": "4", "messages": [], "success": True, "reward": 1.0, "stats": {}}
    files = {"base": write_games(tmp_path / "base", BASE, [gsm8k]) / EPISODES, "RL": write_games(tmp_path / "rl", RL) / EPISODES}
    text = outcomes_markdown(files)
    assert text.startswith("4 games, each by how it ended:")  # the gsm8k row is not a game
    assert body(text) == {"won": ["1", "3"], "lost, every move valid": ["1", "0"], "lost, with invalid moves": ["2", "0"],
                          "unfinished": ["0", "1"], "moves a game": ["4.25", "5.25"], "invalid moves a game": ["0.75", "0.25"],
                          "reward a game": ["0.65", "0.75"]}
    # a game the token budget cut (the loop ends it without the environment's last move) scored 0: not lost
    assert outcome({"stats": {"out_of_tokens": 1.0, "invalid_moves": 1.0}}) == UNFINISHED
    assert outcome({"stats": {"out_of_tokens": 0.0, "invalid_moves": 1.0}}) == LOST_INVALID
    (tmp_path / "none.jsonl").write_text(json.dumps(gsm8k) + "\n")
    assert outcomes_markdown({"other": tmp_path / "none.jsonl"}) == ""


def test_the_textarena_recipe_report_says_how_each_evaluations_games_ended(tmp_path):
    dirs = {"base_eval": write_games(tmp_path / "base", BASE), "rl_eval": write_games(tmp_path / "rl", RL)}
    report = recipe_table(load_recipe("textarena"), dirs, {})
    accuracy, _, outcomes = report.partition("## How the games ended (textarena)")
    assert "| RL − base | +0.500" in accuracy and body(outcomes)["won"] == ["1", "3"]


def test_a_row_without_its_counters_is_refused_naming_its_line(tmp_path):
    directory = write_games(tmp_path / "base", BASE)
    rows = (directory / EPISODES).read_text().splitlines()
    broken = json.loads(rows[1])
    del broken["stats"]
    (directory / EPISODES).write_text("\n".join([rows[0], json.dumps(broken)]) + "\n")
    with pytest.raises(InputError, match="line 2 is not a TextArena episode row with stats and reward"):
        outcomes_markdown({"base": directory / EPISODES})
