"""Shared set-up for the benchmarks: a policy worker on local Ray, chat prompts as a Batch, and host
memory sampled while a long run goes (its peak per step, and how that peak grows)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import psutil
import torch

from posttrain import keys
from posttrain.config.schema import ActorConfig, DataConfig, ModelConfig, RolloutConfig
from posttrain.controller import ResourcePool, WorkerGroup, WorkerSpec, spawn_ray
from posttrain.protocol import Batch, pad_rows
from posttrain.trainer.roles import WORKER_ENV
from posttrain.workers.policy import PolicyWorker


def chat_prompt_ids(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    numbers = torch.randint(10, 99, (count, 2), generator=generator).tolist()
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}? Explain briefly."}], add_generation_prompt=True, tokenize=True, return_dict=False)
        for a, b in numbers
    ]


def prompt_batch(prompts: list[list[int]], pad_token_id: int) -> Batch:
    width = max(len(p) for p in prompts)
    ids = pad_rows(prompts, width, pad_token_id, left=True)
    mask = pad_rows([[1] * len(p) for p in prompts], width, left=True)
    return Batch.from_dict({keys.PROMPT_IDS: ids, keys.PROMPT_MASK: mask})


def start_policy(model: str, max_prompt: int, max_response: int, temperature: float = 1.0, dtype: str = "auto") -> tuple[WorkerGroup, ResourcePool]:
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    pool = ResourcePool("bench", [1], cpus_per_bundle=os.cpu_count() or 1)
    actor = ActorConfig(ppo_mini_batch_size=1_000_000, ppo_micro_batch_size_per_gpu=16, dtype=dtype)
    spec = WorkerSpec(PolicyWorker, (ModelConfig(path=model), actor, RolloutConfig(n=1, temperature=temperature),
                                      DataConfig(max_prompt_length=max_prompt, max_response_length=max_response)))
    return spawn_ray({"actor": spec}, pool, env=WORKER_ENV)["actor"], pool


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def median(values: list[float]) -> float:
    return statistics.median(values)


def tree_rss() -> int:
    """Resident bytes of this process and all its descendants."""
    total = 0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:  # it exited between the listing and the read
            pass
    return total


class MemorySampler(threading.Thread):
    """Samples :func:`tree_rss` while a run goes, keeping the peak of each step that ``step_now``
    names: every step is then seen at the same phase (its peak), whatever the sampling period."""

    def __init__(self, step_now: Callable[[], int], period_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.step_now, self.period_s = step_now, period_s
        self.peaks: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            step = self.step_now()
            self.peaks[step] = max(self.peaks.get(step, 0), tree_rss())


def peak_growth(peaks: Mapping[int, int], early: Iterable[int], late: Iterable[int]) -> tuple[float, float, float]:
    """(early, late, late / early): the median of the peaks of the ``early`` steps and of the ``late`` ones."""
    early_peak = statistics.median(peaks[s] for s in early if s in peaks)
    late_peak = statistics.median(peaks[s] for s in late if s in peaks)
    return early_peak, late_peak, late_peak / early_peak
