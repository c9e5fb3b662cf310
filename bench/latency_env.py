"""An arithmetic environment whose every step waits ``latency_ms`` first: a stand-in for an agent
environment that calls a service (a retriever, a simulator, a judge) on each turn.

An episode takes ``steps`` agent turns: the first ``steps - 1`` are tool calls (any text; the
observation is a fixed tool result), the last is the answer, scored like the arithmetic task's
single-turn reward. The wait is paid once per batched step (``step_batch``), as one service
round-trip per agent-loop turn would be.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from posttrain.agents.env import Environment, EpisodeSample, StepInfo, StepResult
from posttrain.rewards.arithmetic import compute_score


class LatencyArithmeticEnv(Environment):
    name = "latency_arithmetic"

    def __init__(self, latency_ms: float = 0.0, steps: int = 1) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.latency_ms, self.steps = latency_ms, steps
        self.answer, self.taken = "", 0

    def reset(self, sample: EpisodeSample) -> str:
        self.answer, self.taken = str(sample.ground_truth), 0
        return ""

    def step(self, action: str) -> StepResult:
        self.taken += 1
        if self.taken < self.steps:
            return StepResult("tool result: ok", 0.0, False, StepInfo(valid=True, effective=True))
        return self.finish(action)

    def finish(self, action: str) -> StepResult:
        result = compute_score(action, self.answer)
        return StepResult("", float(result["score"]), True, StepInfo(valid=True, effective=True, success=result["acc"] > 0))

    def final_turn_instruction(self) -> str:
        return "Give the final answer now."

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        if envs:
            time.sleep(envs[0].latency_ms / 1000)
        return [env.step(action) for env, action in zip(envs, actions)]
