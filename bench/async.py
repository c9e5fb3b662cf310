"""Trained samples per second, asynchronous over synchronous training, on the same task in one run.

Headline task: the search agent (preset ``search_grpo``) on the real model (``--model``, default
SmolLM2-135M-Instruct; a search agent's SFT export, e.g. ``runs/posttrain/search/sft/export`` from
``posttrain recipe search``, searches more, so more of its time waits on the retriever), over the
synthetic encyclopedia, against one BM25 retriever that this script starts with ``--latency-ms``
(default 200) added to every search (``posttrain serve-retriever --latency-ms``), like a remote
service; both runs use it (``env.retriever.url``). The same run is made twice through the CLI,
``trainer.mode=sync`` and ``trainer.mode=async``, ``--steps`` steps each.

Throughput is the samples trained by the last step over the wall time from the first step's start
(its end less its ``timing_s/step``: in async mode, when the trainer began waiting for its first
batch, with the generators starting beside it) to the last step's end. Both sides are counted from
the same point, after the processes and engines are up, so the async side gets no credit for
batches its generators made before its window opened, and neither side pays its start-up (printed
beside it, with the steady figure from the first to the last logged step).

The async side: two generators (``--generators``, half a CPU each, so the trainer keeps one), each
taking a whole batch per call, ``async.max_staleness=2``: a generator plays its episodes' turns one
after another, waiting on the retriever between them, so two generators on two batches wait side by
side, which staleness 2 allows.

Second line (``--tiny``, on by default): the tiny random model on the arithmetic environment whose
every step waits the same latency (``bench/latency_env.py``), where the wait dominates: the
frameworks' ceiling rather than a real model's figure.

Last line: ``async_over_sync_at_200ms: <ratio>`` of the search agent (target >= 1.5; the name keeps
200 ms whatever ``--latency-ms`` says only when it is 200, else it names the latency given).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent


@dataclass
class Throughput:
    from_start: float  # samples / (last step's end - first step's start)
    steady: float  # samples / (last step's end - first step's end), the first step's samples left out
    startup_s: float  # from the command's start to the first step's start
    searches: float  # mean env/searches per episode, where the task reports it


def run_cli(overrides: list[str], run_dir: Path, samples_per_step: int, what: str) -> Throughput:
    start = time.time()
    command = [sys.executable, "-m", "posttrain.cli", "train", f"trainer.default_local_dir={run_dir}", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "actor/pg_loss" in r["metrics"]]
    first, last = steps[0], steps[-1]
    first_start = first["time"] - first["metrics"]["timing_s/step"]
    # env/searches is the step's count (over agent/episodes episodes): per episode, the one over the other
    searches = [r["metrics"]["env/searches"] / r["metrics"]["agent/episodes"] for r in steps if "env/searches" in r["metrics"]]
    return Throughput(
        from_start=samples_per_step * last["step"] / (last["time"] - first_start),
        steady=samples_per_step * (last["step"] - first["step"]) / (last["time"] - first["time"]),
        startup_s=first_start - start,
        searches=sum(searches) / len(searches) if searches else float("nan"),
    )


def async_overrides(args: argparse.Namespace, mode: str) -> list[str]:
    return [f"trainer.mode={mode}", f"async.max_staleness={args.max_staleness}", f"async.num_generators={args.generators}",
            f"async.generator_cpus={args.generator_cpus}", f"async.unit_groups={args.prompts}"]


def search_runs(args: argparse.Namespace, out: Path) -> dict[str, Throughput]:
    from posttrain.agents.retriever.process import RetrieverProcess
    from posttrain.data import prepare

    data = out / "search-data"
    prepare("synthetic-search", data, train_size=args.prompts * (args.steps + 4), val_size=4, sft_size=0)
    results = {}
    with RetrieverProcess(data / "corpus.jsonl", "bm25", latency_ms=args.latency_ms, log_path=out / "retriever.log") as service:
        for mode in ("sync", "async"):
            overrides = [
                "--preset", "search_grpo", f"actor_rollout_ref.model.path={args.model}", f"env.retriever.url={service.url}",
                f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'test.parquet'}]",
                f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
                f"actor_rollout_ref.rollout.n={args.n}", f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=100",
                "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
                f"actor_rollout_ref.rollout.cpu_kv_cache_gb={args.kv_cache_gb}", *async_overrides(args, mode),
            ]
            results[mode] = run_cli(overrides, out / f"search-{mode}", args.prompts * args.n, f"search agent, {mode}")
    return results


def tiny_runs(args: argparse.Namespace, out: Path) -> dict[str, Throughput]:
    from posttrain.models import cached_tiny_model

    env_steps, turn_tokens = 3, 16
    results = {}
    for mode in ("sync", "async"):
        overrides = [
            f"actor_rollout_ref.model.path={cached_tiny_model('llama')}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
            "trainer.test_freq=-1", f"trainer.total_training_steps={args.tiny_steps}", "trainer.total_epochs=100",
            "env.name=latency_arithmetic", f"env.path={BENCH / 'latency_env.py'}", "env.class_name=LatencyArithmeticEnv",
            f"env.options.latency_ms={args.latency_ms}", f"env.options.steps={env_steps}", f"env.max_turns={env_steps}",
            f"env.max_turn_tokens={turn_tokens}", "env.max_obs_length=16",
            f"data.max_response_length={env_steps * (turn_tokens + 16)}", "data.train_batch_size=8",
            "data.builtin_options.train_size=32", "data.builtin_options.val_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.25",
            *async_overrides(argparse.Namespace(**{**vars(args), "prompts": 8}), mode),
        ]
        results[mode] = run_cli(overrides, out / f"tiny-{mode}", 32, f"tiny model, {mode}")
    return results


def line(label: str, results: dict[str, Throughput]) -> float:
    sync, asynchronous = results["sync"], results["async"]
    ratio = asynchronous.from_start / sync.from_start
    searches = "" if sync.searches != sync.searches else f"; searches per episode {sync.searches:.2f} sync, {asynchronous.searches:.2f} async"
    print(f"{label}: samples/s from the first step's start: sync {sync.from_start:.3f}, async {asynchronous.from_start:.3f}, "
          f"ratio {ratio:.2f} (steady, first to last step: {sync.steady:.3f} vs {asynchronous.steady:.3f}, "
          f"{asynchronous.steady / sync.steady:.2f}; start-up {sync.startup_s:.0f} s vs {asynchronous.startup_s:.0f} s){searches}",
          flush=True)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the search agent's model (built-in name or directory)")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="added to every search (and every tiny-task step)")
    parser.add_argument("--steps", type=int, default=8, help="training steps of each search run")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--generator-cpus", type=float, default=0.5)
    parser.add_argument("--kv-cache-gb", type=float, default=2.0,
                        help="each vLLM engine's KV cache on CPU (actor_rollout_ref.rollout.cpu_kv_cache_gb), both modes")
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=True, help="also the tiny-model line")
    parser.add_argument("--tiny-steps", type=int, default=12)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="async-bench-"))
    print(f"search agent on {args.model}, {args.prompts} prompts x {args.n}, {args.steps} steps, {args.latency_ms:g} ms a search; "
          f"async: {args.generators} generator(s) x {args.generator_cpus:g} CPU, max_staleness {args.max_staleness}; runs in {out}",
          flush=True)
    if args.tiny:
        line(f"tiny model, latency arithmetic ({args.latency_ms:g} ms a step)", tiny_runs(args, out))
    ratio = line(f"search agent ({args.model})", search_runs(args, out))
    print(f"async_over_sync_at_{args.latency_ms:g}ms: {ratio:.2f}")


if __name__ == "__main__":
    main()
