"""What ``posttrain prepare bfcl`` wrote and left out (:class:`Report`), as text for the console and the
prepared directory's README.md (:func:`readme`); :mod:`posttrain.data.preparers.bfcl` fills it in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from posttrain.data.preparers import bfcl_added as added_rows
from posttrain.rewards import bfcl


@dataclass
class Report:
    """What ``prepare_bfcl`` wrote and left out, as text for the console and README.md."""

    splits: dict[str, list[str]]  # split -> its categories
    counts: dict[str, Counter[str]]  # split -> rows per category, before the length cap
    names: dict[str, set[str]]  # split -> its function names
    max_prompt_tokens: int | None = None
    rl_prompt_tokens: int | None = None
    dropped: Counter[str] = field(default_factory=Counter)  # training rows over the cap (rl_prompt_tokens if given), per category
    rl_only: Counter[str] = field(default_factory=Counter)  # training rows kept for RL alone, per category
    test_over: int = 0  # held-out rows over max_prompt_tokens (kept)
    longest: dict[str, int] = field(default_factory=dict)  # split -> its longest prompt, in tokens
    unwritten: list[str] = field(default_factory=list)  # ids of training answers no call satisfies
    sft_sizes: tuple[int, int] = (0, 0)  # transcripts for SFT training, validation
    multi_turn: Counter[str] = field(default_factory=Counter)  # test_multi_turn.parquet's rows per category
    cut: Counter[str] = field(default_factory=Counter)  # training rows dropped for no_call_share, per category
    no_call_share: float | None = None
    made: dict[str, tuple[int, int, Counter]] = field(default_factory=dict)  # option -> rows written, asked for, by calls asked
    joined: Counter[str] | None = None  # joined_values: training rows renamed, per new category (None: not asked)

    def text(self) -> str:
        lines = []
        for split, categories in self.splits.items():
            kept = {c: self.counts[split][c] - self.dropped[c] - self.cut[c] for c in categories}
            lines.append(f"{split}: {sum(kept.values())} rows: " + ", ".join(f"{c} {n}" for c, n in kept.items()))
            if split == "train" and self.rl_prompt_tokens is not None:
                lines.append(f"of the train rows, kept for RL alone, longer than {self.max_prompt_tokens} prompt tokens and within "
                             f"{self.rl_prompt_tokens} (rl_prompt_tokens; no SFT transcript, never a development row): "
                             f"{sum(self.rl_only.values())} ({', '.join(f'{c} {n}' for c, n in self.rl_only.items()) or 'none'})")
        for option, (written, asked, calls) in self.made.items():
            by_calls = f" (by calls asked: {', '.join(f'{n}: {calls[n]}' for n in sorted(calls))})" if len(calls) > 1 else ""
            lines.append(f"{added_rows.REPORT_LINES[option][0]} ({option}={asked}): {written}{added_rows.REPORT_LINES[option][1]}{by_calls}")
        if self.joined is not None:
            lines.append(f"joined_values: {sum(self.joined.values())} train rows take a category of their own (of the above: "
                         f"{', '.join(f'{c} {n}' for c, n in sorted(self.joined.items())) or 'none'}), two arguments' values joined by 'and'")
        if self.no_call_share is not None:
            lines.append(f"dropped from train for no_call_share={self.no_call_share}: {sum(self.cut.values())} "
                         f"({', '.join(f'{c} {n}' for c, n in self.cut.items()) or 'none'})")
        if self.max_prompt_tokens is not None:
            lines.append(f"dropped from train as longer than {self.rl_prompt_tokens or self.max_prompt_tokens} prompt tokens: {sum(self.dropped.values())} "
                         f"({', '.join(f'{c} {n}' for c, n in self.dropped.items()) or 'none'}); held-out rows longer than "
                         f"{self.max_prompt_tokens}, kept: "
                         f"{self.test_over}; longest prompt: train {self.longest['train']} (before the cap), test {self.longest['test']}")
        shared = sorted(self.names["train"] & self.names["test"])
        lines.append(f"function names in both splits: {len(shared)}" + (f" (e.g. {', '.join(shared[:5])})" if shared else ""))
        lines.append(f"SFT transcripts: {self.sft_sizes[0]} train, {self.sft_sizes[1]} validation; possible answers no call satisfies "
                     f"(no transcript): {len(self.unwritten)}" + (f" ({', '.join(self.unwritten)})" if self.unwritten else ""))
        if self.multi_turn:
            lines.append(f"test_multi_turn: {sum(self.multi_turn.values())} rows: " + ", ".join(f"{c} {n}" for c, n in self.multi_turn.items()))
        return "\n".join(lines)


def readme(report: str) -> str:
    """README.md of a prepared BFCL directory: the source, its license and the report."""
    return (f"# BFCL, prepared by `posttrain prepare bfcl`\n\nFrom the PyPI package bfcl-eval {bfcl.installed_version()} "
            "(the Berkeley Function Calling Leaderboard's data, possible answers and AST checker; license Apache-2.0), "
            f"its files under bfcl_eval/data as installed.\n\n```\n{report}\n```\n")
