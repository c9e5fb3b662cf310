"""Hugging Face ``generate`` as the rollout engine: the fallback for models vLLM cannot serve.

Same contract as every rollout engine (see ``base``). How it is met here:
- each prompt is repeated n times (prompt-major) and the rows are left-padded into batches of at
  most ``max_batch_size`` sequences (by default as many as keep the processed scores that the
  logprobs need, ``rows x max_new_tokens x vocab`` float32 values, under ``SCORES_BUDGET_BYTES``:
  one big batch decodes much faster on a CPU than several small ones); repeating rows ourselves
  rather than asking ``generate`` for ``num_return_sequences`` also serves greedy decoding, where
  ``generate`` refuses n > 1;
- the model's own generation defaults (repetition penalty, top-k, ...) are replaced at load time
  by bare eos/pad ids, so only :class:`GenerationParams` decides how to sample;
- behaviour logprobs are the log-softmax of ``generate``'s processed scores (after temperature,
  top-k, top-p) gathered at the sampled tokens, as vLLM's ``processed_logprobs``. Holding those
  scores costs ``max_new_tokens x rows x vocab`` floats per batch, which the batch size bounds;
- after ``generate``, each row is cut at the first eos / stop token id (kept) or at the token that
  completes a stop string (kept), whichever comes first, or at its length budget
  ``min(max_new_tokens, max_model_len - prompt_len)``; the padding ``generate`` puts after a
  finished row is dropped;
- with a seed, batch ``b`` samples under ``torch`` RNG seeded ``seed + b`` in a forked RNG state,
  so the caller's RNG is untouched. Results depend on ``max_batch_size`` (it changes batches).
  ``generate`` draws from one stream per call, so per-prompt ``seeds`` put each prompt in a call of
  its own (its ``n`` rows together) under its seed: exact, and slower than one batch (agent turns
  sampled on this engine pay it; greedy turns need no seed and stay batched).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from posttrain.engines.rollout.base import (
    FinishReason,
    Generation,
    GenerationParams,
    RolloutEngine,
    check_prompts_fit,
    check_seeds,
)
from posttrain.models.loading import load_causal_lm, load_tokenizer, resolve_dtype, resolve_model


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both ``(len(prompts), longest)``, padded on the left."""
    longest = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            input_ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, longest - len(prompt) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def response_end(
    tokens: Sequence[int],
    budget: int,
    stop_token_ids: set[int],
    stop_strings: Sequence[str],
    decode,
) -> tuple[int, FinishReason]:
    """Where a sampled row ends, ``(length, finish_reason)``, by the module docstring's rules.

    ``decode(token_ids) -> str`` is used only when there are stop strings.
    """
    limit = min(budget, len(tokens))
    reason: FinishReason = "length"
    for position, token in enumerate(tokens[:limit]):
        if token in stop_token_ids:
            limit, reason = position + 1, "stop"
            break
    if stop_strings and any(s in decode(tokens[:limit]) for s in stop_strings):
        # Smallest prefix whose text holds a stop string (text only grows with the prefix).
        low, high = 1, limit
        while low < high:
            middle = (low + high) // 2
            if any(s in decode(tokens[:middle]) for s in stop_strings):
                high = middle
            else:
                low = middle + 1
        return low, "stop"
    return limit, reason


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


SCORES_BUDGET_BYTES = 2**30  # the processed scores of one generate call, float32, by default


class HFRolloutEngine(RolloutEngine):
    """Rollout with ``transformers`` ``generate`` on one device.

    Args:
        model_path: built-in model name or local HF model directory.
        dtype: weights' dtype (``"float32"``, ``"bfloat16"``, ...) or ``"auto"`` (bfloat16 where
            ``device`` computes it natively, else float32).
        device: ``"cuda"`` if available, else ``"cpu"``, when None.
        max_model_len: context length; the model's ``max_position_embeddings`` when None.
        max_batch_size: most sequences (prompts x n) sampled in one ``generate`` call; a
            single prompt's n samples always go together, even when n is larger. None: as many
            as keep the call's processed scores under ``SCORES_BUDGET_BYTES``.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        max_model_len: int | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        from transformers import GenerationConfig

        path = resolve_model(model_path)
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._model = load_causal_lm(path, dtype=resolve_dtype(dtype, self._device), device=self._device)
        self._tokenizer = load_tokenizer(path)
        config_eos = self._model.generation_config.eos_token_id
        config_eos = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
        self._eos_token_ids = (set(config_eos) | {self._tokenizer.eos_token_id}) - {None}
        # No eos here: every call passes its own stop ids, and an unset value in a call's config
        # would fall back to this one (which would stop on eos despite ignore_eos).
        self._model.generation_config = GenerationConfig(
            bos_token_id=self._tokenizer.bos_token_id, pad_token_id=self._tokenizer.pad_token_id
        )
        positions = self._model.config.max_position_embeddings
        if max_model_len is not None and max_model_len > positions:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings="
                f"{positions} ({path / 'config.json'}); use at most {positions}."
            )
        self._max_model_len = max_model_len or positions
        self._max_batch_size = max_batch_size

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], params: GenerationParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        check_prompts_fit(prompt_token_ids, self._max_model_len)
        check_seeds(seeds, len(prompt_token_ids))
        if seeds is not None and not params.greedy:  # a stream per prompt: a call per prompt (module docstring)
            calls = [(index, index + 1, seeds[index]) for index in range(len(prompt_token_ids))]
        else:
            per_call = max(1, self._rows_per_call(params) // params.n)
            calls = [(start, start + per_call, None if params.seed is None else params.seed + number)
                     for number, start in enumerate(range(0, len(prompt_token_ids), per_call))]
        generations = []
        for start, end, seed in calls:
            with _seeded(seed, self._device):
                generations.extend(self._generate_batch(prompt_token_ids[start:end], start, params))
        return generations

    def _rows_per_call(self, params: GenerationParams) -> int:
        if self._max_batch_size is not None:
            return self._max_batch_size
        vocabulary = self._model.get_output_embeddings().weight.shape[0]
        return SCORES_BUDGET_BYTES // (4 * vocabulary * max(1, params.max_new_tokens))

    def _stop_token_ids(self, params: GenerationParams) -> set[int]:
        eos_ids = set() if params.ignore_eos else self._eos_token_ids
        return set(params.stop_token_ids) | eos_ids

    def _generation_config(self, params: GenerationParams, max_new_tokens: int):
        from transformers import GenerationConfig

        sampling = {}
        if not params.greedy:
            # top_k=0 turns off transformers' default top-k of 50.
            sampling = dict(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0
            )
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not params.greedy,
            eos_token_id=sorted(self._stop_token_ids(params)) or None,
            pad_token_id=self._tokenizer.pad_token_id,
            stop_strings=list(params.stop) or None,
            output_scores=params.logprobs,
            return_dict_in_generate=True,
            **sampling,
        )

    @torch.inference_mode()
    def _generate_batch(
        self, batch: Sequence[Sequence[int]], first_prompt_index: int, params: GenerationParams
    ) -> list[Generation]:
        budgets = [min(params.max_new_tokens, self._max_model_len - len(p)) for p in batch]
        config = self._generation_config(params, max(budgets))
        rows = [prompt for prompt in batch for _ in range(params.n)]
        input_ids, attention_mask = left_pad(rows, self._tokenizer.pad_token_id, self._device)
        output = self._model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            tokenizer=self._tokenizer if params.stop else None,
        )
        responses = output.sequences[:, input_ids.shape[1] :]
        logprobs = _sampled_logprobs(output.scores, responses).tolist() if params.logprobs else None
        stop_ids = self._stop_token_ids(params)
        generations = []
        for row, tokens in enumerate(responses.tolist()):
            local_prompt, sample = divmod(row, params.n)
            length, reason = response_end(
                tokens, budgets[local_prompt], stop_ids, params.stop, self._tokenizer.decode
            )
            generations.append(
                Generation(
                    prompt_index=first_prompt_index + local_prompt,
                    sample_index=sample,
                    response_token_ids=tokens[:length],
                    logprobs=logprobs[row][:length] if logprobs is not None else None,
                    finish_reason=reason,
                    weight_version=self.version,
                )
            )
        return generations

    @torch.no_grad()
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each named tensor into the parameter or buffer of the same name, in place."""
        state = self._model.state_dict()
        for name, tensor in named_tensors:
            if name not in state:
                raise KeyError(
                    f"Weight {name!r} is not a parameter of the rollout model "
                    f"({type(self._model).__name__}); send Hugging Face names as in "
                    "model.state_dict() of the same architecture."
                )
            if state[name].shape != tensor.shape:
                raise ValueError(
                    f"Weight {name!r} has shape {tuple(tensor.shape)}, the rollout model's has "
                    f"{tuple(state[name].shape)}; the trainer and the rollout engine must hold "
                    "the same architecture."
                )
            state[name].copy_(tensor)


def _sampled_logprobs(scores: Sequence[torch.Tensor], responses: torch.Tensor) -> torch.Tensor:
    """``(rows, steps)`` log-softmax of each step's processed scores at the sampled token."""
    columns = [
        torch.log_softmax(step_scores.float(), dim=-1).gather(-1, responses[:, step, None])
        for step, step_scores in enumerate(scores)
    ]
    return torch.cat(columns, dim=-1).cpu()
