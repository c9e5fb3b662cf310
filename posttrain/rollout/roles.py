"""The workers a rollout calls, as the rollout sees them.

In synchronous training these are the run's worker groups (``trainer/roles.py``: the policy's
``generate``/``generate_turn``, the reward model, the Env-LLM); inside an asynchronous generator the
"actor" is the generator itself (:class:`~posttrain.rollout.generator.GeneratorWorker`). A rollout
knows only these protocols, so the same rollout code runs in both places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from posttrain.protocol import Batch


class Sampler(Protocol):
    """What samples for the policy: one response per prompt row, or one agent turn per context."""

    def generate(self, batch: Batch) -> Batch:
        """PROMPT_IDS/PROMPT_MASK rows → TURN_TOKEN_IDS, TURN_LOGPROBS, FINISH_REASON; meta WEIGHT_VERSION."""
        ...

    def generate_turn(self, batch: Batch) -> Batch:
        """TURN_CONTEXT_IDS rows (each seeded by its TURN_REQUEST_KEYS) → TURN_TOKEN_IDS, TURN_LOGPROBS, FINISH_REASON;
        meta WEIGHT_VERSION."""
        ...

    def release_rollout(self) -> object:
        """The engine may sleep: a multi-turn rollout is over."""
        ...


class RewardScorer(Protocol):
    def compute_rm_score(self, batch: Batch) -> Batch:
        """TOKEN_SCORES (B, T) from the reward model, on each response's last token."""
        ...


class ChatModel(Protocol):
    def chat(self, batch: Batch) -> Batch:
        """The Env-LLM worker: replies to conversations (``rollout/env_llm.py`` wraps it as a client)."""
        ...


@dataclass
class RolloutRoles:
    actor: Sampler
    reward_model: RewardScorer | None = None
    env_llm: ChatModel | None = None
