"""Rollout throughput: vLLM inside the policy worker vs standalone vLLM, and vLLM vs HF generate.

Same prompts (64 chat prompts, up to 64 new tokens, temperature 1, SmolLM2-135M-Instruct), same run:
  in-worker:  PolicyWorker.generate on local Ray (the Batch in, tokens + logprobs out, via Ray)
  standalone: VLLMRolloutEngine.generate in this process
  hf:         HFRolloutEngine.generate in this process (fp32)
Throughput = generated tokens / second; medians of interleaved repeats. Headline: in-worker / standalone
(target >= 0.9); vLLM / HF is reported too.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from bench.common import chat_prompt_ids, median, prompt_batch, start_policy, timed  # noqa: E402
from posttrain import keys  # noqa: E402
from posttrain.engines.rollout import GenerationParams, HFRolloutEngine, VLLMRolloutEngine  # noqa: E402
from posttrain.models import load_tokenizer, resolve_model  # noqa: E402

PROMPTS, NEW_TOKENS, REPEATS = 64, 64, 3


def main() -> None:
    model = str(resolve_model("smollm2-135m-instruct"))
    tokenizer = load_tokenizer(model)
    prompts = chat_prompt_ids(tokenizer, PROMPTS)
    batch = prompt_batch(prompts, tokenizer.pad_token_id)
    max_prompt = max(len(p) for p in prompts)
    worker, pool = start_policy(model, max_prompt, NEW_TOKENS)
    standalone = VLLMRolloutEngine(model, max_model_len=max_prompt + NEW_TOKENS, kv_cache_bytes=1 << 30)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)

    def in_worker() -> int:
        return sum(len(ids) for ids in worker.generate(batch)[keys.TURN_TOKEN_IDS])

    def alone() -> int:
        return sum(len(g.response_token_ids) for g in standalone.generate(prompts, params))

    in_worker(), alone()  # warm-up
    rates: dict[str, list[float]] = {"worker": [], "standalone": []}
    for _ in range(REPEATS):
        for name, fn in (("worker", in_worker), ("standalone", alone)):
            seconds, tokens = timed(fn)
            rates[name].append(tokens / seconds)
    pool.release()

    hf = HFRolloutEngine(model, max_model_len=max_prompt + NEW_TOKENS, max_batch_size=PROMPTS)
    seconds, generations = timed(lambda: hf.generate(prompts, params))
    hf_rate = sum(len(g.response_token_ids) for g in generations) / seconds
    worker_rate, standalone_rate = median(rates["worker"]), median(rates["standalone"])
    print(f"{PROMPTS} prompts x <= {NEW_TOKENS} new tokens, SmolLM2-135M-Instruct, CPU threads {os.cpu_count()}")
    print(f"vLLM in the policy worker (via Ray) : {worker_rate:8.1f} tokens/s")
    print(f"vLLM standalone, same process       : {standalone_rate:8.1f} tokens/s")
    print(f"HF generate (fp32)                  : {hf_rate:8.1f} tokens/s")
    print(f"vllm_over_hf: {standalone_rate / hf_rate:.2f}")
    print(f"rollout_in_worker_ratio: {worker_rate / standalone_rate:.2f}")


if __name__ == "__main__":
    main()
