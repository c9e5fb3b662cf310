"""The Env-LLM worker: a frozen language model that speaks for the environment (a patient, a user, a judge).

It serves ``env.llm.model_path`` with the rollout engine (vLLM; HF generate as the fallback) and
answers one batched :meth:`chat` call per agent-loop round: chat messages in, text out, with its own
sampling settings (greedy by default) and ``max_tokens``. It never receives policy weights and never
sleeps, so on a GPU the memory it takes when it is built (before the policy) stays its own.

A prompt longer than ``max_model_len - max_tokens`` loses its oldest dialogue turns (the first
message, e.g. the patient's case, is kept), and then, if it is still too long, its first tokens.
"""

from __future__ import annotations

from typing import Any

from posttrain import keys
from posttrain.config.schema import EnvLLMConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.errors import InputError
from posttrain.models import load_tokenizer, resolve_model
from posttrain.protocol import Batch
from posttrain.workers.engines import env_llm_engine, env_llm_params


class EnvLLMWorker(Worker):
    def __init__(self, ctx: WorkerContext, config: EnvLLMConfig, *, seed: int = 0) -> None:
        super().__init__(ctx)
        path = str(resolve_model(config.model_path))
        self.tokenizer = load_tokenizer(path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise InputError(f"env.llm.model_path={config.model_path!r}: its tokenizer has no chat template; the Env-LLM needs a chat model")
        self.engine = env_llm_engine(path, config, seed=seed + ctx.rank)
        self.prompt_limit = self.engine.max_model_len - config.max_tokens
        self.params = env_llm_params(config, seed=seed + ctx.rank)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def chat(self, batch: Batch) -> Batch:
        """ENV_LLM_MESSAGES → ENV_LLM_REPLY, FINISH_REASON, ENV_LLM_PROMPT_TOKENS, ENV_LLM_COMPLETION_TOKENS."""
        prompts = [self.prompt_ids(list(messages)) for messages in batch[keys.ENV_LLM_MESSAGES]]
        generations = self.engine.generate(prompts, self.params)
        return Batch.from_dict(non_tensors={
            keys.ENV_LLM_REPLY: [self.tokenizer.decode(g.response_token_ids, skip_special_tokens=True) for g in generations],
            keys.FINISH_REASON: [g.finish_reason for g in generations],
            keys.ENV_LLM_PROMPT_TOKENS: [len(p) for p in prompts],
            keys.ENV_LLM_COMPLETION_TOKENS: [len(g.response_token_ids) for g in generations],
        })

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The templated prompt, fitted to the context (module docstring)."""
        while True:
            ids = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
            if len(ids) <= self.prompt_limit or len(messages) <= 2:
                return ids[-self.prompt_limit:]
            messages = messages[:1] + messages[3:]  # drop the oldest exchange after the first message
