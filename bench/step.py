"""One GRPO step of the main job, by phase, and the framework's overhead over standalone parts.

The trainer (preset arithmetic_grpo: SmolLM2-135M-Instruct, 8 prompts x n=8, vLLM, local Ray) runs
one warm-up step and then one measured step. The baseline does the same work with the libraries
alone, in this process, on the same prompts and the tokens the step produced:
  standalone vLLM generation of the 64 samples (same sampling settings),
  a plain PyTorch no-grad forward (PPO's old logprobs) only if the step ran one (the main job's
  single optimizer step takes π_old from the update's own forward pass, so it runs none), and a
  forward/backward/AdamW step of those tokens (bench.train's hand-written loop).
The step trains every sample (``skip_zero_advantage=false``), as the baseline does.
Headline: step time / baseline time (target <= 1.15). Each phase's share of the step is printed.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
os.environ.setdefault("KMP_BLOCKTIME", "0")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from bench.common import timed  # noqa: E402
from bench.train import PlainLoop  # noqa: E402
from posttrain import keys  # noqa: E402
from posttrain.config import load_config, preset_path  # noqa: E402
from posttrain.engines.rollout import VLLMRolloutEngine  # noqa: E402
from posttrain.models import resolve_dtype, resolve_model  # noqa: E402
from posttrain.protocol import Batch  # noqa: E402
from posttrain.rollout.batching import prompt_token_lists, repeat_for_groups, sequences_to_batch  # noqa: E402
from posttrain.trainer.setup import RolloutService, rollout_setup  # noqa: E402
from posttrain.trainer.run import workers_up  # noqa: E402
from posttrain.trainer.sync import sync_parts  # noqa: E402
from posttrain.workers.engines import generation_params  # noqa: E402


def main() -> None:
    import ray

    # every sample trained, as the baseline trains them all (the step's default leaves out zero-advantage samples)
    overrides = ["trainer.logger=[]", "trainer.default_local_dir=/tmp/posttrain-bench-step",
                 "actor_rollout_ref.actor.skip_zero_advantage=false"]
    config = load_config([preset_path("arithmetic_grpo")], overrides)
    setup = rollout_setup(config)
    parts = sync_parts(setup)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    with workers_up(config, setup.total_steps, [RolloutService(setup.rollout)]) as roles:
        batches = iter(setup.data.train)
        parts.step(roles, next(batches), 1)  # warm-up
        prompts = next(batches)
        metrics = parts.step(roles, prompts, 2)
    ray.shutdown()

    rollout_config, data = config.actor_rollout_ref.rollout, config.data
    model = str(resolve_model(config.actor_rollout_ref.model.path))
    engine = VLLMRolloutEngine(model, max_model_len=data.max_prompt_length + data.max_response_length, kv_cache_bytes=int(rollout_config.cpu_kv_cache_gb * 2**30))
    repeated = repeat_for_groups(prompts, rollout_config.n)
    params = generation_params(rollout_config, data.max_response_length, validation=False, seed=7)
    prompt_lists = prompt_token_lists(repeated)
    engine.generate(prompt_lists, params)  # warm-up
    gen_s, generations = timed(lambda: engine.generate(prompt_lists, params))
    responses = sequences_to_batch(prompt_lists, [g.response_token_ids for g in generations], pad_token_id=0,
                                   response_width=data.max_response_length, logprobs=[g.logprobs or [] for g in generations])
    batch = repeated.union(responses)
    batch = batch.union(Batch.from_dict({keys.ADVANTAGES: torch.randn(len(batch), 1) * batch[keys.RESPONSE_MASK],
                                         keys.OLD_LOGPROBS: torch.zeros(batch[keys.RESPONSE_MASK].shape)}))
    dtype = resolve_dtype("auto", torch.device("cpu"))  # what the engine picks here
    plain = PlainLoop(resolve_model(model), dtype, lr=1e-6)
    plain.step(batch)  # warm-up

    def forward_only() -> None:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            for micro in batch.split(rollout_config.log_prob_micro_batch_size_per_gpu):
                plain.model(input_ids=micro[keys.INPUT_IDS], attention_mask=micro[keys.ATTENTION_MASK], use_cache=False)

    # The same phases as the step: the old-logprob pass only where the step had one.
    fwd_s = timed(forward_only)[0] if "timing_s/old_log_prob" in metrics else 0.0
    train_s, _ = timed(lambda: plain.step(batch))
    baseline = gen_s + fwd_s + train_s
    step_s = metrics["timing_s/step"]
    print(f"one GRPO step: {len(batch)} samples, {int(metrics['perf/total_num_tokens'])} tokens")
    for name, value in sorted(metrics.items()):
        if name.startswith("timing_s/") and name != "timing_s/step":
            print(f"  {name:28s} {value:7.2f} s  ({value / step_s:5.1%})")
    print(f"  {'timing_s/step':28s} {step_s:7.2f} s")
    forward = f"forward {fwd_s:.2f} s" if fwd_s else "no old-logprob forward (nor had the step)"
    print(f"baseline: vLLM generate {gen_s:.2f} s + {forward} + forward/backward/step {train_s:.2f} s = {baseline:.2f} s")
    print(f"step_overhead_ratio: {step_s / baseline:.2f}")


if __name__ == "__main__":
    main()
