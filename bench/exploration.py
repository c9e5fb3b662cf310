"""How likely a policy is to search again after its first search, on the two-hop questions of a validation dump.

For each two-hop episode of ``<run dir>/validation/step_N.jsonl`` whose first action was a search, the
context is laid out exactly as the agent loop feeds it (prompt, the search, its observation, the next
assistant header) and the policy's probability of starting its next turn with ``<search>`` rather
than ``<answer>`` is read off at the rollout temperature. Its mean says whether GRPO's groups can ever
contain the behaviour RL is meant to discover: with a group of n samples, the chance that a group
holds at least one second search is ``1 - (1 - p)^n``.

    .venv/bin/python -m bench.exploration MODEL_DIR runs/.../validation/step_0.jsonl --temperature 1.0 --n 4

Last line: ``second_search_probability: <mean p>``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from posttrain.agents.transcript import TranscriptTokenizer
from posttrain.models import load_causal_lm, load_tokenizer, resolve_model

STOP_STRINGS = ("</search>", "</answer>")


def continuation_logprob(model, context: list[int], continuation: list[int], temperature: float) -> float:
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return float(logprobs[torch.arange(len(continuation)), torch.tensor(continuation)].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("episodes")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=4, help="GRPO group size")
    args = parser.parse_args()
    model_dir = resolve_model(args.model)
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir, dtype=torch.float32).eval()
    layout = TranscriptTokenizer(tokenizer, STOP_STRINGS)
    rows = [json.loads(line) for line in open(args.episodes, encoding="utf-8")]
    chances = []
    for row in rows:
        messages = row["messages"]
        if row["extra_info"].get("hops") != 2 or len(messages) < 3 or "<search>" not in messages[1]["content"]:
            continue
        # the context ends with the next turn's assistant header: lay out a turn and keep what precedes it
        placeholder = "<answer> x </answer>"  # ends on a stop string: no end-of-turn token follows it
        transcript = layout(messages[:3] + [{"role": "assistant", "content": placeholder}])
        context = transcript.prompt_ids + transcript.response_ids[: -len(tokenizer.encode(placeholder, add_special_tokens=False))]
        search = continuation_logprob(model, context, tokenizer.encode("<search>", add_special_tokens=False), args.temperature)
        answer = continuation_logprob(model, context, tokenizer.encode("<answer>", add_special_tokens=False), args.temperature)
        chances.append(float(torch.tensor([search, answer]).softmax(0)[0]))
    if not chances:
        raise SystemExit("no two-hop episode whose first action was a search in this dump")
    p = statistics.fmean(chances)
    print(f"{len(chances)} two-hop episodes that searched first; temperature {args.temperature}")
    print(f"P(search again | first observation): mean {p:.3g}, median {statistics.median(chances):.3g}, max {max(chances):.3g}")
    print(f"groups of {args.n} holding at least one second search: {statistics.fmean(1 - (1 - c) ** args.n for c in chances):.3f}")
    print(f"second_search_probability: {p:.3g}")


if __name__ == "__main__":
    main()
