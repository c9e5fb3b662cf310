"""The rollout-engine interface: token ids in, sampled responses with behaviour logprobs out.

A rollout engine samples ``n`` responses for each prompt and reports, for every sampled token, the
log-probability the sampling distribution gave it (the *behaviour* logprob). That distribution is
the model's next-token distribution after temperature, top-k and top-p, renormalised over the kept
tokens: exactly the distribution the token was drawn from, which is what off-policy corrections
(importance ratios against the trainer's logprobs) need. Greedy decoding (``temperature == 0``)
reports the untempered log-softmax.

Engines take new weights in place (``load_weights``) tagged with a version number, so every
sample can say which weights made it (async training bounds staleness with it).

Contract shared by all engines:
- ``generate`` returns ``len(prompts) * n`` generations, prompt-major:
  prompt 0 samples 0..n-1, then prompt 1, ...
- ``response_token_ids`` are the tokens exactly as sampled (never re-tokenised text); a response
  that ended on eos or a stop token id includes that token; one that ended on a stop string
  includes the token that completed the string (the text may run past the string).
- ``finish_reason`` is ``"stop"`` (eos, stop token id or stop string) or ``"length"``
  (``max_new_tokens`` reached, or the engine's context ``max_model_len`` filled).
- a prompt longer than the context raises :class:`PromptTooLongError` before any work is done.
- ``seeds`` (one per prompt) gives each prompt a random stream of its own: the same prompt, seed,
  params and weights give the same samples whatever else the call holds, so two callers that batch
  the same requests differently (the agent loop and a program's endpoint) sample alike. Without
  them ``params.seed`` seeds the call, and a prompt's samples depend on its place in it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from posttrain.errors import InvalidSettings, Problem, PromptTooLongError

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationParams:
    """How to sample. ``temperature == 0`` means greedy; ``top_k=None``/``top_p=1`` mean no cut.

    ``seed`` makes sampling reproducible: the same prompts, params and weights give the same
    samples on the same engine and machine. Every sample still gets its own random stream, so the
    ``n`` samples of a prompt, and the samples of a prompt that appears twice, differ.
    ``ignore_eos`` keeps sampling past eos (for benchmarks that need fixed lengths).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str) or isinstance(self.stop_token_ids, int):
            raise ValueError(
                "GenerationParams.stop and stop_token_ids are collections, e.g. stop=('\\n\\n',) "
                f"and stop_token_ids=(2,); got stop={self.stop!r}, "
                f"stop_token_ids={self.stop_token_ids!r}."
            )
        # Lists (e.g. from a YAML config) become tuples so the params stay hashable and frozen.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        problems = []
        if self.max_new_tokens < 1:
            problems.append(Problem("max_new_tokens", self.max_new_tokens, "must be >= 1"))
        if self.temperature < 0:
            problems.append(Problem("temperature", self.temperature, "must be >= 0 (0 means greedy)"))
        if not 0 < self.top_p <= 1:
            problems.append(Problem("top_p", self.top_p, "must be in (0, 1] (1: no nucleus cut)"))
        if self.top_k is not None and self.top_k < 1:
            problems.append(Problem("top_k", self.top_k, "must be >= 1, or None for no top-k cut"))
        if self.n < 1:
            problems.append(Problem("n", self.n, "must be >= 1"))
        if problems:
            raise InvalidSettings("GenerationParams", problems)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One sampled response.

    ``logprobs[i]`` is the behaviour logprob of ``response_token_ids[i]`` (``None`` when the params
    asked for no logprobs). ``prompt_index`` is the prompt's position in the ``generate`` call,
    ``sample_index`` its sample number in ``0..n-1``; ``weight_version`` the engine's version when
    the response was made.
    """

    prompt_index: int
    sample_index: int
    response_token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    weight_version: int


def check_prompts_fit(prompt_token_ids: Sequence[Sequence[int]], max_model_len: int) -> None:
    """Raise unless every prompt is non-empty and leaves room for at least one new token."""
    for index, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise ValueError(
                f"Prompt {index} is empty; every prompt needs at least one token (a chat prompt "
                "holds at least its template's role markers)."
            )
        if len(prompt) >= max_model_len:
            raise PromptTooLongError(
                f"Prompt {index} has {len(prompt)} tokens but the rollout engine's context is "
                f"max_model_len={max_model_len} tokens, which must hold the prompt plus at least "
                "one new token. Filter or truncate long prompts (data.max_prompt_length), or "
                "start the engine with a larger max_model_len (up to the model's "
                "max_position_embeddings)."
            )


def check_seeds(seeds: Sequence[int] | None, prompts: int) -> None:
    """Raise unless ``seeds`` is None or holds one seed per prompt."""
    if seeds is not None and len(seeds) != prompts:
        raise ValueError(f"{len(seeds)} seeds for {prompts} prompts: give one seed per prompt, or none")


class RolloutEngine(abc.ABC):
    """Samples responses from token ids and takes new weights in place; see the module docstring."""

    def __init__(self) -> None:
        self._version = 0

    @property
    def version(self) -> int:
        """Version of the weights in use: 0 for the weights the engine started with."""
        return self._version

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int:
        """Context length in tokens: prompt plus response never exceeds it."""

    @abc.abstractmethod
    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], params: GenerationParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Sample ``params.n`` responses per prompt; returns them prompt-major. ``seeds``: one per
        prompt, overriding ``params.seed`` (module docstring)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy weights (Hugging Face parameter names) into the engine in place; set ``version``.

        ``named_tensors`` may be a generator (it is consumed once) and may hold a subset of the
        weights, as long as it holds every tensor of each decoder layer it touches (vLLM rebuilds
        whole layers); a full state dict always works. Versions never go backwards.
        """
        if version < self._version:
            raise ValueError(
                f"Weight version {version} is older than the engine's version {self._version}; "
                "pass the trainer's current version (it only ever increases)."
            )
        self._load_weights(named_tensors)
        self._version = version

    @abc.abstractmethod
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Engine-specific in-place copy of the weights."""

    # sleep / wake_up are deliberately concrete no-ops: most engines have nothing to free.
    def sleep(self) -> None:  # noqa: B027
        """Free accelerator memory between rollouts (KV cache; weights too at deeper levels).

        A no-op where there is nothing to free (CPU).
        """

    def wake_up(self) -> None:  # noqa: B027
        """Re-acquire what :meth:`sleep` freed; a no-op where ``sleep`` is."""
