"""Rollout engines: token ids in, sampled responses with behaviour logprobs out (see ``base``).

:class:`VLLMRolloutEngine` is the default (vLLM in-process, CPU or GPU); :class:`HFRolloutEngine`
is the fallback for models vLLM cannot serve. The engine modules import vLLM / transformers only
when an engine is built.
"""

from posttrain.engines.rollout.base import (
    FinishReason,
    Generation,
    GenerationParams,
    PromptTooLongError,
    RolloutEngine,
    check_prompts_fit,
)
from posttrain.engines.rollout.hf_engine import HFRolloutEngine
from posttrain.engines.rollout.vllm_engine import VLLMRolloutEngine

__all__ = [
    "FinishReason",
    "Generation",
    "GenerationParams",
    "HFRolloutEngine",
    "PromptTooLongError",
    "RolloutEngine",
    "VLLMRolloutEngine",
    "check_prompts_fit",
]
