"""The environment's language model during a run: the in-cluster Env-LLM worker, or a server at ``env.llm.url``.

:func:`needs_env_llm_worker` decides, from the config alone and before any worker starts, whether the
run builds the Env-LLM worker (the environment asks for ``env_llm`` and no ``env.llm.url`` is set).
:func:`open_env_llm` hands environments a client of either backend (``agents/env_llm.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from posttrain import keys
from posttrain.agents.env_llm import (
    EnvLLMClient,
    EnvLLMError,
    EnvLLMReply,
    Messages,
    OpenAIChatClient,
    ReplyCache,
    model_identity,
)
from posttrain.config.schema import EnvLLMConfig, PosttrainConfig
from posttrain.models import resolve_model
from posttrain.protocol import Batch
from posttrain.config.mixture import mixture_sources
from posttrain.rollout.environments import load_env_class, wanted_resources
from posttrain.rollout.roles import ChatModel


def uses_env_llm(config: PosttrainConfig) -> bool:
    """The environment asks for ``env_llm``, or a ``reward.rubric`` part is a judge (rewards/judge.py); in a
    mixture, any source's (they share the run's one Env-LLM, config/mixture.py)."""
    if config.mixture:
        return any(uses_env_llm(source.config) for source in mixture_sources(config))
    env = config.env
    if any(isinstance(part, Mapping) and part.get("judge") is not None for part in config.reward.rubric):
        return True
    return env.name is not None and "env_llm" in wanted_resources(load_env_class(env.name, env.path, env.class_name), env.options)


def needs_env_llm_worker(config: PosttrainConfig) -> bool:
    return uses_env_llm(config) and not config.env.llm.url


class WorkerEnvLLM(EnvLLMClient):
    """The Env-LLM worker group behind the :class:`EnvLLMClient` interface: one ``chat`` call per batch.

    Not retried: the worker is part of the run, so a worker that died or raised stops the run with
    its own error, as any other role's failure does."""

    def __init__(self, group: ChatModel) -> None:
        super().__init__()
        self.group = group

    def describe(self) -> str:
        return "the Env-LLM worker"

    def _request(self, conversations: Sequence[Messages]) -> list[EnvLLMReply]:
        reply = self.group.chat(Batch.from_dict(non_tensors={keys.ENV_LLM_MESSAGES: [list(c) for c in conversations]}))
        return [
            EnvLLMReply(str(text), str(reason), int(prompt), int(completion))
            for text, reason, prompt, completion in zip(
                reply[keys.ENV_LLM_REPLY], reply[keys.FINISH_REASON], reply[keys.ENV_LLM_PROMPT_TOKENS],
                reply[keys.ENV_LLM_COMPLETION_TOKENS], strict=True,
            )
        ]


def open_env_llm(config: EnvLLMConfig, worker_group: ChatModel | None) -> EnvLLMClient:
    """A client of the server at ``config.url`` (checked with one request: a wrong URL, model name or
    key fails here, with the fix), or of the run's Env-LLM worker group; with ``config.reply_cache``,
    replies asked before come from that file."""
    client = _open_client(config, worker_group)
    if config.reply_cache:
        model = config.url or str(resolve_model(config.model_path))
        client.cache = ReplyCache(config.reply_cache, model_identity(
            model, api_model=config.api_model, temperature=config.temperature, top_p=config.top_p,
            max_tokens=config.max_tokens, max_model_len=config.max_model_len,
        ))
    return client


def _open_client(config: EnvLLMConfig, worker_group: ChatModel | None) -> EnvLLMClient:
    if config.url:
        client = OpenAIChatClient(
            config.url, config.api_model or config.model_path, temperature=config.temperature, top_p=config.top_p,
            max_tokens=config.max_tokens, timeout_s=config.timeout_s, retries=config.retries,
            api_key=os.environ.get(config.api_key_env) if config.api_key_env else None,
        )
        try:
            client.check()
        except EnvLLMError as error:
            client.close()
            raise EnvLLMError(f"{error}; set env.llm.url to a running OpenAI-compatible server (e.g. `vllm serve MODEL`) "
                              "and env.llm.api_model to a model it serves, or unset env.llm.url to serve the model in the cluster") from None
        return client
    if worker_group is None:
        raise RuntimeError("the environment asks for env_llm but the run started no Env-LLM worker (roles.env_llm is None)")
    return WorkerEnvLLM(worker_group)
