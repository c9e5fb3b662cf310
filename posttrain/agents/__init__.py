"""Multi-turn agents: text environments and the batched agent loop (see loop.py)."""

from posttrain.agents.env import EpisodeAnswer, EpisodeSample, Environment, StepInfo, StepResult
from posttrain.agents.loop import AgentLoopConfig, Episode, GenerateTurn, TurnOutput, run_episodes, turn_budgets
from posttrain.agents.metrics import episode_metrics
from posttrain.agents.render import ObservationRenderer

__all__ = [
    "AgentLoopConfig", "Environment", "Episode", "EpisodeAnswer", "EpisodeSample", "GenerateTurn", "ObservationRenderer", "StepInfo",
    "StepResult", "TurnOutput", "episode_metrics", "run_episodes", "turn_budgets",
]
