"""Whether training taught a BFCL policy *when* to call, or only moved *how often* it calls.

    .venv/bin/python scripts/call_decision.py --episodes RUN/sft_eval/episodes.jsonl [--episodes MORE.jsonl] \
        SFT=RUN/sft/export RL=RUN/rl_export [--check SFT=RUN/sft_eval/episodes.jsonl] [--limit N]

Each ``NAME=MODEL`` is a model directory (``posttrain export`` makes one from a checkpoint) or a built-in
name. The rows are an evaluation's episodes (``posttrain eval --dump-episodes``; a recipe's eval stage
writes ``episodes.jsonl``; ``--episodes`` again adds another's rows, ``--limit`` keeps each file's first N): each
row's question with its own functions, rendered as the evaluation rendered it. For each row and model one forward pass scores the greedy first step: the **margin** of the
token that opens a call (the first token of ``<tool_call>``) over the best other first token, in
log-probability. Greedy decoding starts a call exactly when the margin is above 0.

Printed, as Markdown, per model: how well the margin tells the rows that need a call from the irrelevance
rows whatever the threshold (the area under the ROC curve, with a bootstrap interval over rows), the call
rate where a call is due and the calls on irrelevance rows at the model's own threshold (0); then each later
model's AUC minus the first's (paired over rows); then the first model with its margin shifted by the
constant that gives it each later model's call rate where due, and its calls on irrelevance rows there. When
a later model's irrelevance calls are no fewer than the shifted first model's and its AUC is no higher,
training moved the threshold along the first model's curve and taught nothing about when to call.
``--check NAME=EPISODES`` prints the share of rows on which a model's margin agrees with whether its own
evaluation's greedy answer made a call (the episodes of that model's evaluation): a check that the rows
are rendered as the evaluation rendered them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from posttrain.errors import PosttrainError
from posttrain.models.tool_format import row_schemas
from posttrain.rewards import bfcl
from posttrain.rewards.bfcl_mistakes import episode_rows

CALL_OPEN = "<tool_call>"


def read_rows(path: Path, limit: int | None = None) -> list[dict]:
    """BFCL episode rows of ``path`` (other data sources left out), the first ``limit``."""
    rows = episode_rows(path)
    return rows[:limit] if limit else rows


def row_key(row: dict) -> str:
    """What names a row across evaluations of the same rows: BFCL's id (else its index)."""
    return json.dumps(row["extra_info"].get("id", row["extra_info"].get("index")))


def prompt_messages(row: dict) -> list[dict[str, str]]:
    """The conversation before the row's first answer."""
    messages = row["messages"]
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return [{"role": m["role"], "content": m["content"]} for m in messages[:first]]


def margins(model_path: str, rows: list[dict]) -> np.ndarray:
    """Each row's greedy first-step margin for opening a call (module docstring), from one forward pass."""
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.loading import check_causal_lm_config, resolve_model, tokenize_prompts

    path = resolve_model(model_path)
    check_causal_lm_config(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # float32, as a margin near 0 decides: bf16 moved the log-probabilities here by up to 0.2; sdpa for long prompts
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    opener = tokenizer.encode(CALL_OPEN, add_special_tokens=False)[0]
    out = np.empty(len(rows))
    with torch.inference_mode(), Progress(transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task(f"{model_path}", total=len(rows))
        for index, row in enumerate(rows):
            ids = tokenize_prompts([prompt_messages(row)], tokenizer, row_tools=[row_schemas(row["extra_info"].get("tools"))])[0]
            logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float().log_softmax(-1)
            opening = logits[opener].item()
            logits[opener] = -float("inf")
            out[index] = opening - logits.max().item()
            progress.advance(task)
    return out


def auc(due: np.ndarray, irrelevant: np.ndarray) -> float:
    """P(margin on a row that needs a call > margin on an irrelevance row), ties counted half."""
    if not len(due) or not len(irrelevant):
        return float("nan")
    ordered = np.sort(irrelevant)
    below = np.searchsorted(ordered, due, side="left")
    tied = np.searchsorted(ordered, due, side="right") - below
    return float((below + tied / 2).sum() / (len(due) * len(irrelevant)))


def shifts_for_rate(due: np.ndarray, rate: float) -> tuple[float, float]:
    """The range of constants that, added to the margins ``due``, make the share of them above 0 equal ``rate``
    (as near as the rows allow): from the smallest such shift to just below the next row's."""
    calls = int(round(rate * len(due)))
    ordered = np.sort(due)[::-1]
    low = -float(ordered[calls - 1]) if calls else -np.inf  # just above this, the calls-th row calls
    high = -float(ordered[calls]) if calls < len(ordered) else np.inf  # at this, one more row would
    return low, high


def calls_within(margins: np.ndarray, shifts: tuple[float, float]) -> tuple[int, int]:
    """The fewest and most of ``margins`` above 0 over the shifts strictly inside ``shifts``."""
    low, high = shifts
    return int((margins + low > 0).sum()), int((margins + high >= 0).sum()) if np.isfinite(high) else len(margins)


def report(models: dict[str, np.ndarray], needs_call: np.ndarray, *, resamples: int = 1000, seed: int = 0) -> str:
    """The Markdown tables of the module docstring, for ``models`` (name → each row's margin)."""
    rng = np.random.default_rng(seed)
    due_rows, irr_rows = np.flatnonzero(needs_call), np.flatnonzero(~needs_call)
    draws = [(rng.choice(due_rows, len(due_rows)), rng.choice(irr_rows, len(irr_rows))) for _ in range(resamples)]

    def interval(values: list[float], sign: str = "") -> str:
        low, high = np.nanpercentile(values, [2.5, 97.5])
        return f"[{low:{sign}.3f}, {high:{sign}.3f}]"

    names = list(models)
    boot = {name: [auc(m[d], m[i]) for d, i in draws] for name, m in models.items()}
    lines = [f"{len(due_rows)} rows need a call, {len(irr_rows)} are irrelevance rows.", "",
             "| model | AUC (call-due vs irrelevance) | call rate where due | calls on irrelevance rows |", "|---|---|---|---|"]
    for name, m in models.items():
        lines.append(f"| {name} | {auc(m[due_rows], m[irr_rows]):.3f} {interval(boot[name])} | {(m[due_rows] > 0).mean():.3f} "
                     f"| {int((m[irr_rows] > 0).sum())} of {len(irr_rows)} |")
    first = names[0]
    if len(names) > 1:
        lines += ["", "| | AUC difference (paired over rows) |", "|---|---|"]
        for name in names[1:]:
            diff = auc(models[name][due_rows], models[name][irr_rows]) - auc(models[first][due_rows], models[first][irr_rows])
            lines.append(f"| {name} − {first} | {diff:+.3f} {interval([b - a for a, b in zip(boot[first], boot[name])], sign='+')} |")
        lines += ["", f"{first} with its margin shifted to each later model's call rate where due:", "",
                  "| shifted to | shift (log-prob) | call rate where due | calls on irrelevance rows (over the shifts that give it) | that model's own |", "|---|---|---|---|---|"]
        base = models[first]
        for name in names[1:]:
            rate = (models[name][due_rows] > 0).mean()
            shifts = shifts_for_rate(base[due_rows], rate)
            fewest, most = calls_within(base[irr_rows], shifts)
            low, high = shifts
            middle = (low + high) / 2 if np.isfinite([low, high]).all() else (low + 1 if np.isfinite(low) else high - 1)
            lines.append(f"| {name} | {middle:+.2f} | {(base[due_rows] + middle > 0).mean():.3f} | "
                         f"{fewest if fewest == most else f'{fewest} to {most}'} of {len(irr_rows)} | {int((models[name][irr_rows] > 0).sum())} |")
    return "\n".join(lines)


def answer_called(row: dict) -> bool:
    """Whether the row's greedy answer opened a call."""
    answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    return bool(answers) and answers[0].lstrip().startswith(CALL_OPEN)


def main(arguments: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="NAME=MODEL")
    parser.add_argument("--episodes", required=True, type=Path, action="append",
                        help="an evaluation's episodes: the rows (again for more rows, e.g. another file's irrelevance rows)")
    parser.add_argument("--check", action="append", default=[], metavar="NAME=EPISODES",
                        help="that model's own evaluation episodes, to check its margins against its greedy answers")
    parser.add_argument("--limit", type=int, default=None, help="the first N rows only")
    args = parser.parse_args(arguments)
    pairs = [a.split("=", 1) for a in args.models]
    checks = [a.split("=", 1) for a in args.check]
    if any(len(p) != 2 or not all(p) for p in pairs + checks):
        parser.error("give each model as NAME=MODEL and each check as NAME=EPISODES")
    if unknown := {name for name, _ in checks} - {name for name, _ in pairs}:
        parser.error(f"--check names {sorted(unknown)}, which are not among the models")
    try:
        rows = [row for path in args.episodes for row in read_rows(path, args.limit)]
        needs_call = np.array([not bfcl.is_no_call_category(r["extra_info"]["category"]) for r in rows])
        if needs_call.all() or not needs_call.any():
            raise SystemExit("call_decision: the rows need both kinds, rows that need a call and irrelevance rows")
        models = {name: margins(path, rows) for name, path in pairs}
        print(report(models, needs_call))
        for name, path in checks:
            own = {row_key(r): answer_called(r) for r in read_rows(path)}
            pairs_seen = [(models[name][i] > 0, own[row_key(r)]) for i, r in enumerate(rows) if row_key(r) in own]
            if not pairs_seen:
                raise SystemExit(f"call_decision: {path} holds none of the rows")
            agree = sum(a == b for a, b in pairs_seen) / len(pairs_seen)
            print(f"\n{name}: its margin agrees with its evaluation's greedy answers (call or not) on {agree:.3f} of {len(pairs_seen)} rows")
    except (PosttrainError, OSError) as error:
        raise SystemExit(f"call_decision: {error}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
