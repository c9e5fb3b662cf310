"""Runs' memory and time step by step, read from their own metrics files (``<run>/metrics.jsonl``).

    python -m bench.step_metrics before=runs/a after=runs/b [--every 5] [--group policy]

For each run (``LABEL=RUN_DIR``, in the order given): every ``--every``-th step's step-end resident
memory of the group's worker process (``memory/<group>/rss_gb``), its high-water mark, glibc's heap in
use and kept free (``heap_used_gb``, ``heap_free_gb``), and the step's ``timing_s/{gen,update_actor,step}``;
then the run's summary: step-end RSS and heap in use at the first and last step, their ratio, and the
median update and step seconds over steps 2 onwards (step 1 builds caches), and the steps' seconds summed
(the run's time in steps, across a resume too). It runs nothing: it reads
what a run wrote, so anyone can check a figure against the files.

Last line: ``step_memory_growth: X``, the last run's step-end RSS at its last step over its first.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

FIELDS = ("rss_gb", "peak_rss_gb", "heap_used_gb", "heap_free_gb")
TIMES = ("gen", "update_actor", "step")


def steps(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of each line of the run's metrics file that has a step's memory."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [(r["step"], r["metrics"]) for r in records if any(k.startswith("memory/") for k in r["metrics"])]


def describe(label: str, run_dir: Path, group: str, every: int) -> float:
    """Print one run's table and summary; returns its step-end RSS growth (last over first)."""
    found = steps(run_dir)
    if not found:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no step with memory/{group}/* metrics")
    print(f"{label}: {run_dir} ({len(found)} steps)")
    for step, metrics in found:
        if (step - 1) % every == 0 or step == found[-1][0]:
            memory = ", ".join(f"{name} {metrics.get(f'memory/{group}/{name}', float('nan')):.3f}" for name in FIELDS)
            times = ", ".join(f"{name} {metrics.get(f'timing_s/{name}', float('nan')):.1f} s" for name in TIMES)
            print(f"  step {step}: {memory}; {times}")
    first, last = found[0][1], found[-1][1]
    rss = [m[f"memory/{group}/rss_gb"] for m in (first, last)]
    heap = [m.get(f"memory/{group}/heap_used_gb", float("nan")) for m in (first, last)]
    later = [m for s, m in found if s > 1] or [first]
    medians = {name: statistics.median(m[f"timing_s/{name}"] for m in later if f"timing_s/{name}" in m) for name in TIMES if any(f"timing_s/{name}" in m for m in later)}
    total = sum(m.get("timing_s/step", 0.0) for _, m in found)
    print(f"  step-end RSS {rss[0]:.2f} -> {rss[1]:.2f} GB ({rss[1] / rss[0]:.3f}x), heap in use {heap[0]:.3f} -> {heap[1]:.3f} GB; "
          "median from step 2: " + ", ".join(f"{name} {value:.1f} s" for name, value in medians.items())
          + f"; all steps {total / 60:.1f} min")
    return rss[1] / rss[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR, one per run")
    parser.add_argument("--every", type=int, default=5, help="print every Nth step (and the last)")
    parser.add_argument("--group", default="policy", help="the memory metrics' group (policy, env_llm, ...)")
    args = parser.parse_args()
    growth = 0.0
    for run in args.runs:
        label, sep, directory = run.partition("=")
        if not sep:
            parser.error(f"{run!r}: give LABEL=RUN_DIR")
        growth = describe(label, Path(directory), args.group, args.every)
    print(f"step_memory_growth: {growth:.3f}")


if __name__ == "__main__":
    main()
