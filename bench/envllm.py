"""The Env-LLM worker's batched replies per second inside a run vs the same engine standalone, and the
share of a doctor training step spent waiting for the patient.

Prompts: the patient's prompt (``patient_messages``: hidden description + question) for each of the
three case questions of ``--cases`` held-out synthetic-doctor cases, i.e. ``3 * cases`` conversations,
answered greedily with ``max_tokens`` new tokens (the ``doctor_grpo`` preset's ``env.llm`` settings).

1. standalone: the Env-LLM engine (``workers.engines.env_llm_engine``, vLLM on CPU) built in this
   process; the templated prompts go straight to ``generate``.
2. in the run: the run's own role layout (``start_roles`` on the ``doctor_grpo`` config: the Env-LLM
   worker colocated with the policy on local Ray), called through the client environments use
   (``WorkerEnvLLM.chat``: a Batch through Ray, the chat template applied in the worker).

Each side answers the whole batch ``--repeats`` times after one warm-up; replies/s is the median. The
ratio in-run / standalone is the cost of the worker plumbing (target >= 0.9).

3. ``--steps`` doctor_grpo training steps (SmolLM2 doctor and patient, no validation) through the
   sync trainer; the share is ``env_llm/wait_s / timing_s/step`` per step (0 disables this part).

The last line is ``envllm_in_run_over_standalone: <ratio>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# The standalone engine runs with the OpenMP settings the run's workers get (trainer/roles.py WORKER_ENV:
# passive waiting, which a process sharing its cores needs), so the ratio is the worker's plumbing alone.
# With OpenMP's defaults here instead, standalone measured 9.8 replies/s against the worker's 8.4 (0.86).
os.environ.setdefault("KMP_BLOCKTIME", "0")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def conversations(count: int) -> list[list[dict[str, str]]]:
    from posttrain.agents.doctor import case_from_sample, patient_messages
    from posttrain.agents.env import EpisodeSample
    from posttrain.data import prepare, read_rows

    out_dir = Path(tempfile.mkdtemp(prefix="envllm-bench-"))
    _, test = prepare("synthetic-doctor", out_dir, train_size=64, val_size=max(count, 32))
    chats = []
    for row in read_rows([test])[:count]:
        case = case_from_sample(EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info))
        chats += [patient_messages(case.description, [], pair.question) for pair in case.qa]
    return chats


def replies_per_second(answer, chats, repeats: int) -> float:
    answer(chats)  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        answer(chats)
        rates.append(len(chats) / (time.perf_counter() - start))
    return statistics.median(rates)


def standalone(config, chats, repeats: int) -> float:
    from posttrain.models import load_tokenizer, resolve_model
    from posttrain.engines.rollout import GenerationParams
    from posttrain.workers.engines import env_llm_engine

    path = str(resolve_model(config.env.llm.model_path))
    tokenizer = load_tokenizer(path)
    engine = env_llm_engine(path, config.env.llm, seed=0)
    params = GenerationParams(max_new_tokens=config.env.llm.max_tokens, temperature=0.0, n=1, logprobs=False)
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]
    return replies_per_second(lambda _: engine.generate(prompts, params), chats, repeats)


def in_run(config, chats, repeats: int) -> float:
    from posttrain.rollout.env_llm import open_env_llm
    from posttrain.trainer.roles import start_roles

    roles = start_roles(config, total_steps=1)
    try:
        client = open_env_llm(config.env.llm, roles.env_llm)
        return replies_per_second(client.chat, chats, repeats)
    finally:
        roles.release()


def step_share(config, steps: int) -> list[float]:
    from dataclasses import replace

    from posttrain.trainer.modes import training_run

    run_dir = tempfile.mkdtemp(prefix="envllm-bench-run-")
    trainer_config = replace(config.trainer, total_training_steps=steps, val_before_train=False, test_freq=-1, save_freq=-1,
                             default_local_dir=run_dir, logger=["jsonl"])
    training_run(replace(config, trainer=trainer_config)).fit()
    records = [json.loads(line)["metrics"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [m["env_llm/wait_s"] / m["timing_s/step"] for m in records]


def main() -> None:
    import ray

    from posttrain.config.loader import load_config, preset_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. env.llm.model_path=DIR")
    args = parser.parse_args()
    config = load_config([preset_path("doctor_grpo")], args.overrides)
    chats = conversations(args.cases)
    print(f"{len(chats)} patient conversations, max_tokens={config.env.llm.max_tokens}, model {config.env.llm.model_path}")
    alone = standalone(config, chats, args.repeats)
    print(f"standalone engine: {alone:.1f} replies/s")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        inside = in_run(config, chats, args.repeats)
        print(f"Env-LLM worker in the run: {inside:.1f} replies/s")
        if args.steps:
            shares = step_share(config, args.steps)
            print("share of each doctor step waiting for the patient: " + ", ".join(f"{s:.3f}" for s in shares))
    finally:
        ray.shutdown()
    print(f"envllm_in_run_over_standalone: {inside / alone:.3f}")


if __name__ == "__main__":
    main()
