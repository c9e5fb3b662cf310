"""Compare two runs' metrics.jsonl, step by step: the same steps, the same metric names, equal values.

Wall-clock metrics (``timing_s/*``, ``timing_per_token_ms/*``, ``perf/throughput``,
``perf/time_per_step``) and each process's resident memory (``memory/*/rss_gb``) differ between any two
runs and are skipped, as is ``run/restarts`` (how
often a run was restarted after a dead worker: a restarted run must otherwise equal an uninterrupted one). Exit 0 when everything else is
equal, 1 otherwise (the differences printed).

    python scripts/compare_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl [--shared]

``--shared`` compares only the metrics both records of a step hold (two runs of different rollouts, e.g.
a program and the built-in tool agent, each log counters of their own).
"""

from __future__ import annotations

import json
import sys

WALL_CLOCK = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step")
PER_PROCESS = ("memory/",)
SKIPPED = WALL_CLOCK + PER_PROCESS + ("run/restarts",)


def differences(first: list[dict], second: list[dict], shared: bool = False) -> tuple[int, list[str]]:
    """(values compared, one line per difference); ``shared``: only the names both records of a step hold."""
    if [r["step"] for r in first] != [r["step"] for r in second]:
        return 0, [f"steps differ: {[r['step'] for r in first]} vs {[r['step'] for r in second]}"]
    compared, found = 0, []
    for a, b in zip(first, second):
        held = a["metrics"].keys() & b["metrics"].keys() if shared else a["metrics"].keys() | b["metrics"].keys()
        names = {n for n in held if not n.startswith(SKIPPED)}
        for name in sorted(names):
            compared += 1
            if a["metrics"].get(name, "missing") != b["metrics"].get(name, "missing"):
                found.append(f"step {a['step']} {name}: {a['metrics'].get(name, 'missing')} vs {b['metrics'].get(name, 'missing')}")
    return compared, found


def main(argv: list[str]) -> int:
    shared = "--shared" in argv
    argv = [a for a in argv if a != "--shared"]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    first, second = ([json.loads(line) for line in open(path, encoding="utf-8")] for path in argv)
    compared, found = differences(first, second, shared)
    for line in found:
        print(line)
    print(f"{len(first)} records, {compared} values compared (wall-clock metrics skipped), {len(found)} differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
