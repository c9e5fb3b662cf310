"""How each evaluation's TextArena games ended, side by side: what a recipe's report adds for
``data_source: textarena`` rows (``MISTAKES`` in :mod:`posttrain.rewards.registry`) beside their wins.

Each game is put in one kind by its episode's own counters (the environment's ``stats`` in an episodes
file): **won** (the library's win), **unfinished** (posttrain's turn budget, ``env.max_turns``, or its
token budget, ``data.max_response_length``, cut it before the game ended: it scored 0), else **lost** with every move valid or with at least one invalid move (in
GuessTheNumber a repeated or out-of-range guess is invalid, and two in a row end the game). Below the
kinds: the mean moves, invalid moves and reward a game (the reward is the library's, partial credit for a
lost game), so a policy that wins more by guessing less carefully, or loses by breaking the rules, shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from posttrain.rewards.episodes_file import source_rows

DATA_SOURCE = "textarena"  # the rows of posttrain prepare textarena, played by posttrain.agents.textarena_env
WON, UNFINISHED, LOST_VALID, LOST_INVALID = "won", "unfinished", "lost, every move valid", "lost, with invalid moves"
KINDS = (WON, LOST_VALID, LOST_INVALID, UNFINISHED)


def outcome(row: Mapping) -> str:
    """The kind of ending of one episode row (module docstring)."""
    stats = _stats(row)
    if stats.get("wins"):
        return WON
    if stats.get("unfinished") or stats.get("out_of_tokens"):
        return UNFINISHED
    return LOST_INVALID if stats.get("invalid_moves") else LOST_VALID


def outcomes_markdown(files: Mapping[str, Path]) -> str:
    """Markdown: each kind's count of games, then the means a game, one column per evaluation (``files``:
    label → episodes file); empty when no file holds a TextArena row."""
    rows = {label: source_rows(path, DATA_SOURCE, ("stats", "reward"), "TextArena") for label, path in files.items()}
    if not any(rows.values()):
        return ""
    labels = list(rows)
    counts = {label: Counter(outcome(row) for row in found) for label, found in rows.items()}
    sizes = [len(found) for found in rows.values()]
    size = f"{sizes[0]} games" if len(set(sizes)) == 1 else "Games: " + ", ".join(map(str, sizes))
    lines = [f"{size}, each by how it ended:", "", "| | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    lines += [f"| {kind} | " + " | ".join(str(counts[label][kind]) for label in labels) + " |" for kind in KINDS]
    means = {"moves a game": lambda row: _stats(row).get("num_turns", 0), "invalid moves a game": lambda row: _stats(row).get("invalid_moves", 0),
             "reward a game": lambda row: row["reward"]}
    for name, value in means.items():
        lines.append(f"| {name} | " + " | ".join(f"{sum(map(value, rows[label])) / len(rows[label]):.2f}" if rows[label] else "–"
                                                   for label in labels) + " |")
    return "\n".join(lines)


def _stats(row: Mapping) -> Mapping:
    return row.get("stats") or {}
