"""A recipe's closing table (``report.md``): each eval row's accuracy with its 95 % interval, the compared
rows' paired difference, each stage's wall time (or where a given one came from), what made the stages,
and the mistakes by kind of data sources that say them."""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.recipes import DONE, EPISODES, Recipe


def recipe_table(recipe: Recipe, dirs: dict[str, Path], seconds: dict[str, float], given: dict[str, Path] | None = None) -> str:
    """The rows' accuracies with 95 % intervals (all items, and per ``by``), the compared rows'
    paired difference, each stage's wall time, what made the stages, and last the mistakes by kind
    of data sources that say them (:func:`mistakes`), as Markdown."""
    from posttrain.trainer.validation import item_accuracies, item_groups
    from posttrain.trainer.intervals import paired_difference, wilson

    lines = []
    if recipe.rows:
        loaded = {label: item_accuracies(dirs[stage] / EPISODES) for label, stage in recipe.rows.items()}
        first, first_rows = next(iter(loaded.values()))
        groups = ["all", *sorted(set(item_groups(list(first), first_rows, recipe.by)) - {"all"})]
        lines += ["| | " + " | ".join(groups) + " |", "|---" * (len(groups) + 1) + "|"]
        for label, (accuracies, rows) in loaded.items():
            grouped, cells = item_groups(list(accuracies), rows, recipe.by), []
            for group in groups:
                values = [accuracies[key] for key in grouped.get(group, [])]
                low, high = wilson(sum(values), len(values))
                cells.append(f"{sum(values) / len(values):.3f} [{low:.3f}, {high:.3f}] (n={len(values)})" if values else "—")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        labels = {stage: label for label, stage in recipe.rows.items()}
        for pair in recipe.compare:
            (a, rows), (b, _) = (item_accuracies(dirs[stage] / EPISODES) for stage in pair)
            grouped, cells = item_groups([key for key in a if key in b], rows, recipe.by), []
            for group in groups:
                keys = grouped.get(group, [])
                if keys:
                    difference, low, high = paired_difference([a[key] for key in keys], [b[key] for key in keys])
                    cells.append(f"{difference:+.3f} [{low:+.3f}, {high:+.3f}] (paired)")
                else:
                    cells.append("—")
            lines.append(f"| {labels.get(pair[1], pair[1])} − {labels.get(pair[0], pair[0])} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| stage | wall time |", "|---|---|"]
    lines += [f"| {name} | {value / 60:.1f} min{in_runs(dirs.get(name))} |" for name, value in seconds.items()]
    if seconds:
        lines.append(f"| all | {sum(seconds.values()) / 60:.1f} min |")
    lines += [f"| {name} | given: {path}{given_took(path)} |" for name, path in (given or {}).items()]
    sources = {row.get("data_source") for row in first_rows.values()} if recipe.rows else set()
    return "\n".join(lines + made_by(dirs) + mistakes(recipe, dirs, sources))


def given_took(path: Path) -> str:
    """How long a given stage's directory took when a recipe ran it (its ``DONE``: every run, where a train or
    sft stage resumed; the last run only, where an older recipe wrote it), as " (ran in N min)"; a given export
    (``STAGE/export``, what a later stage takes of an sft or export stage) is timed by the stage that wrote it;
    empty for outputs no recipe stage wrote."""
    if path.name == "export" and not (path / DONE).is_file():
        path = path.parent
    done = path / DONE
    seconds = json.loads(done.read_text()).get("seconds") if done.is_file() else None
    return f" (ran in {seconds / 60:.1f} min{in_runs(path)})" if seconds is not None else ""


def in_runs(path: Path | None) -> str:
    """", in N runs (resumed)" where the stage's ``DONE`` says it took several runs, each going on from the last's
    checkpoints (their times summed); empty for one run."""
    done = path / DONE if path else None
    runs = json.loads(done.read_text()).get("runs", 1) if done and done.is_file() else 1
    return f", in {runs} runs (resumed)" if runs > 1 else ""


def mistakes(recipe: Recipe, dirs: dict[str, Path], sources: set) -> list[str]:
    """For each data source of the rows that can say what kind of mistake each answer is (``MISTAKES``:
    BFCL's mistakes, how TextArena's games ended), its tables for the table's rows side by side, under a heading."""
    from posttrain.rewards.registry import MISTAKES

    files = {label: dirs[stage] / EPISODES for label, stage in recipe.rows.items()}
    lines = []
    for source in sorted(s for s in sources if s in MISTAKES):
        title, markdown = MISTAKES[source]
        if text := markdown(files):
            lines += ["", f"## {title} ({source})", "", text]
    return lines


def made_by(dirs: dict[str, Path]) -> list[str]:
    """What made the stages (their ``provenance.json``): one line when they agree, else one per stage."""
    from posttrain.trainer import provenance

    found = {name: made for name, directory in dirs.items() if (made := provenance.find(directory / provenance.PROVENANCE)) is not None}
    if not found:
        return []
    first = next(iter(found.values()))
    if all(not provenance.differences(first, made) for made in found.values()):
        return ["", f"Made by: {provenance.summary(first)}"]
    return ["", "Made by (the stages differ):"] + [f"- {name}: {provenance.summary(made)}" for name, made in found.items()]
