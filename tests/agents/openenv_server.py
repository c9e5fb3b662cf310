"""A real OpenEnv server for the OpenEnv environment's tests, built with openenv's own classes
(``Environment``, ``Action``, ``Observation``, ``create_app``; the same in ``openenv`` 0.10 and
``openenv-core`` 0.3.0) and served by uvicorn.

The game: guess a secret number from 0 to 9 (``seed % 10``, 7 without a seed). A guess is answered
``higher`` or ``lower`` with reward -0.1, the right one ``correct`` with reward 1.0 and ``done``; a
message that is not a number makes the environment's ``step`` raise (the server's error reply). Every
observation's ``metadata`` holds the secret, which the agent must never see. Each session keeps its own
secret and its own guesses, so concurrent episodes do not mix.

    python -m tests.agents.openenv_server PORT [MAX_SESSIONS]    # what the death test kills
"""

from __future__ import annotations

import sys
import uuid

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    feedback: str
    guesses: int = 0


class GuessingGame(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self._state = 7, State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self.secret = 7 if seed is None else seed % 10
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GuessObservation(feedback="Guess a number from 0 to 9.", metadata={"secret": self.secret})

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        guess = int(action.message.strip())  # not a number: ValueError, answered as the server's error reply
        self._state.step_count += 1
        if guess == self.secret:
            return GuessObservation(feedback="correct", guesses=self._state.step_count, reward=1.0, done=True,
                                    metadata={"secret": self.secret})
        hint = "higher" if guess < self.secret else "lower"
        return GuessObservation(feedback=hint, guesses=self._state.step_count, reward=-0.1, done=False, metadata={"secret": self.secret})

    @property
    def state(self) -> State:
        return self._state


def make_app(max_sessions: int = 8):
    return create_app(GuessingGame, GuessAction, GuessObservation, env_name="guessing_game", max_concurrent_envs=max_sessions)


if __name__ == "__main__":
    port, sessions = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8
    uvicorn.run(make_app(sessions), host="127.0.0.1", port=port, log_level="warning")
