"""Several recipes' compared rows side by side: each configuration's paired difference in every column, read
from the report files (a recipe's report.md, or the docs/measured file that holds it), so that runs made
in different sessions read as one table.

    python scripts/runs_table.py docs/measured/bfcl_t07n8.txt docs/measured/bfcl_dyn_names.txt

Every markdown table row that ends in ``(paired)`` (a recipe's ``A − B`` row) gives one line: the file's
name (with its folder's where two share one: ``A/report.md``), the row's label, then its value in each column,
the columns in the order first seen across the files (blank where a file's table has no such column; "—"
where the compared evaluations share no item of it). The last line is ``runs_table_best_all: X``, the
largest difference in the column ``all``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DIFFERENCE = re.compile(r"^([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\] \(paired\)$")


def compared_rows(path: Path) -> list[tuple[str, dict[str, str]]]:
    """(label, {column: "+0.002 [-0.010, +0.013]"}) for each ``(paired)`` row, by the header above it; "—"
    where the compared evaluations share no item of that column. A row ending in ``(paired) |`` that does not
    read so is refused, naming its line."""
    rows, header = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if not line.rstrip().endswith("(paired) |"):
            continue
        if len(cells) != len(header) or not all(DIFFERENCE.match(cell) or cell == "—" for cell in cells[1:]):
            raise SystemExit(f"{path} line {number}: a compared row that does not read as 'label | +0.000 [-0.000, +0.000] "
                             f"(paired) | ...' under its header of {len(header)} columns: {line[:120]}")
        rows.append((cells[0], {column: cell.removesuffix(" (paired)") for column, cell in zip(header[1:], cells[1:])}))
    return rows


def file_labels(files: list[Path]) -> list[str]:
    """Each file's name without its suffix; with its folder's name where two files share one (``A/report.md``)."""
    stems = [path.stem for path in files]
    return [f"{path.parent.name}/{path.stem}" if stems.count(path.stem) > 1 else path.stem for path in files]


def runs_table(files: list[Path]) -> tuple[str, float | None]:
    """The table as markdown, and the largest difference in the column ``all`` (None without one)."""
    found = [(name, label, values) for path, name in zip(files, file_labels(files)) for label, values in compared_rows(path)]
    if not found:
        raise SystemExit(f"no row ending in '(paired)' in {', '.join(map(str, files))}: give recipe reports")
    columns = list(dict.fromkeys(column for _, _, values in found for column in values))
    lines = ["| file | row | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    lines += [f"| {stem} | {label} | " + " | ".join(values.get(column, "") for column in columns) + " |" for stem, label, values in found]
    overall = [float(values["all"].split()[0]) for _, _, values in found if values.get("all", "—") != "—"]
    return "\n".join(lines), max(overall) if overall else None


def main(arguments: list[str]) -> None:
    if not arguments or arguments[0] in ("-h", "--help"):
        raise SystemExit(__doc__)
    missing = [name for name in arguments if not Path(name).is_file()]
    if missing:
        raise SystemExit(f"no such file: {', '.join(missing)}")
    table, best = runs_table([Path(name) for name in arguments])
    print(table)
    print(f"runs_table_best_all: {'none' if best is None else f'{best:+.3f}'}")


if __name__ == "__main__":
    main(sys.argv[1:])
