"""Copy a bench's recorded output (docs/measured/NAME.txt) into a docs page, between its markers.

    python scripts/measured_to_docs.py docs/performance.md shared_prefix

replaces what lies between ``<!-- measured:NAME -->`` and ``<!-- /measured:NAME -->`` with the file,
as a code block, so the figures on the page are the ones the command printed, never typed by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def main(page: str, *names: str) -> None:
    path = Path(page)
    text = path.read_text()
    for name in names:
        recorded = (path.parent / "measured" / f"{name}.txt").read_text().rstrip("\n")
        pattern = re.compile(rf"(<!-- measured:{name} -->\n).*?(<!-- /measured:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{page} has no <!-- measured:{name} --> ... <!-- /measured:{name} --> markers")
        text = pattern.sub(lambda m: f"{m.group(1)}```text\n{recorded}\n```\n{m.group(2)}", text)
    path.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], *sys.argv[2:])
