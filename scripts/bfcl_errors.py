"""What kind of mistakes a policy makes on BFCL, per category, side by side for several evaluations.

    .venv/bin/python scripts/bfcl_errors.py base=RUN/base_eval/episodes.jsonl \
        SFT=RUN/sft_eval/episodes.jsonl RL=RUN/rl_eval/episodes.jsonl

Each file is an evaluation's episodes (``posttrain eval`` writes them: a recipe's eval stage as
``episodes.jsonl``, a run under ``validation/``; ``--dump-episodes`` too). Prints, as Markdown, the
call rates (on the rows that need a call, the share where the answer made a readable call), the calls
right (of those calls, the share BFCL's checker accepts), the arguments per call (the mean number of
arguments those calls wrote), the calls per answer (the mean number of readable calls where one was made), the right
number of calls by calls wanted, the first call alone (where one call is wanted and several were made) and each
category's mistakes by kind, judged by BFCL's own checker (posttrain/rewards/bfcl_mistakes.py). A BFCL
recipe's report.md ends with the same tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.rewards.bfcl_mistakes import mistakes_markdown


def main(arguments: list[str]) -> None:
    if not arguments or any("=" not in a for a in arguments):
        raise SystemExit(__doc__)
    try:
        print(mistakes_markdown({label: Path(path) for label, path in (a.split("=", 1) for a in arguments)}))
    except (PosttrainError, OSError) as error:
        raise SystemExit(f"bfcl_errors: {error}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
