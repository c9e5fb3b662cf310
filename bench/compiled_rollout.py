"""vLLM's rollout compiled (``actor_rollout_ref.rollout.enforce_eager=false``) against eager (the default).

Same engine class, model (SmolLM2-135M-Instruct), dtype ("auto"), KV cache (1 GiB) and prompts on both sides:
64 chat prompts, 200 new tokens each, temperature 1, seed 0, so decoding dominates as in BFCL's and TextArena's
rollouts. Each side runs in processes of its own (so that each start-up, compilation included, is measured
whole), the two taking turns (eager, compiled, eager, compiled: this machine's speed drifts between minutes):
each process's start-up and its generated tokens a second over 6 calls, the first a warm-up; a side's figure
is the median of its calls after warm-up over both of its processes. Sampling differs a little between the
two (the kernels round differently) and responses end at eos, so the sides decode about, not exactly, the
same tokens: the throughput is tokens / seconds. Headline: compiled / eager tokens a second.

    python -m bench.compiled_rollout
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

PROMPTS, NEW_TOKENS, CALLS, ROUNDS = 64, 200, 6, 2


def one_side(mode: str) -> dict:
    """Start an engine (``mode``: eager or compiled), generate CALLS times; its figures."""
    from bench.common import chat_prompt_ids
    from posttrain.engines.rollout import GenerationParams, VLLMRolloutEngine
    from posttrain.models import load_tokenizer, resolve_model

    model = str(resolve_model("smollm2-135m-instruct"))
    prompts = chat_prompt_ids(load_tokenizer(model), PROMPTS)
    start = time.perf_counter()
    engine = VLLMRolloutEngine(model, max_model_len=max(len(p) for p in prompts) + NEW_TOKENS, kv_cache_bytes=1 << 30,
                               enforce_eager=mode == "eager")
    started = time.perf_counter() - start
    params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    rates = []
    for _ in range(CALLS):
        begin = time.perf_counter()
        tokens = sum(len(g.response_token_ids) for g in engine.generate(prompts, params))
        rates.append(tokens / (time.perf_counter() - begin))
    return {"mode": mode, "start_s": started, "rates": rates[1:], "first_call": rates[0]}


def main() -> None:
    from bench.common import median

    rates: dict[str, list[float]] = {"eager": [], "compiled": []}
    for round_ in range(ROUNDS):
        for mode in rates:
            done = subprocess.run([sys.executable, "-m", "bench.compiled_rollout", "--side", mode], capture_output=True, text=True)
            line = next((line for line in reversed(done.stdout.splitlines()) if line.startswith("{")), None)
            if done.returncode != 0 or line is None:
                sys.exit(f"the {mode} side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            side = json.loads(line)
            rates[mode] += side["rates"]
            print(f"round {round_ + 1} {mode:9s}: start {side['start_s']:6.1f} s; tokens/s {' '.join(f'{r:.0f}' for r in side['rates'])} "
                  f"(warm-up call {side['first_call']:.0f})", flush=True)
    eager, compiled = median(rates["eager"]), median(rates["compiled"])
    print(f"median tokens/s: eager {eager:.1f}, compiled {compiled:.1f}")
    print(f"compiled_over_eager: {compiled / eager:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(one_side(sys.argv[2])))
    else:
        main()
