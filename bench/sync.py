"""Weight sync cost: training engine → vLLM in place, as a share of one training step (SmolLM2-135M).

In one policy worker: generate 64 responses, compute their logprobs, then time
  update:       one PPO update on the 64 samples (forward + backward + AdamW)
  sync_weights: every weight into vLLM through reload_weights (no disk)
Headline: sync seconds / update seconds (target <= 0.03), medians of repeats in the same run.
"""

from __future__ import annotations

import torch

from bench.common import chat_prompt_ids, median, prompt_batch, start_policy, timed
from posttrain import keys
from posttrain.models import load_tokenizer, resolve_model
from posttrain.protocol import Batch
from posttrain.rollout.batching import responses_to_batch

PROMPTS, NEW_TOKENS, REPEATS = 64, 32, 3


def main() -> None:
    model = str(resolve_model("smollm2-135m-instruct"))
    tokenizer = load_tokenizer(model)
    prompts = chat_prompt_ids(tokenizer, PROMPTS)
    worker, pool = start_policy(model, max(len(p) for p in prompts), NEW_TOKENS)
    batch = prompt_batch(prompts, tokenizer.pad_token_id)
    batch = batch.union(responses_to_batch(batch, worker.generate(batch), max_response_length=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id))
    batch = batch.union(worker.compute_log_prob(batch).select([keys.OLD_LOGPROBS]))
    advantages = torch.randn(len(batch), 1) * batch[keys.RESPONSE_MASK]
    batch = batch.union(Batch.from_dict({keys.ADVANTAGES: advantages}))
    update_s, sync_s = [], []
    for version in range(1, REPEATS + 1):
        update_s.append(timed(lambda: worker.update(batch))[0])
        sync_s.append(timed(lambda: worker.sync_weights(version))[0])
    pool.release()
    tokens = int(batch[keys.ATTENTION_MASK].sum())
    print(f"{PROMPTS} samples, {tokens} tokens per update; medians of {REPEATS}")
    print(f"one training step (update) : {median(update_s):7.2f} s")
    print(f"weight sync into vLLM      : {median(sync_s):7.2f} s")
    print(f"sync_share_of_step: {median(sync_s) / median(update_s):.3f}")


if __name__ == "__main__":
    main()
