"""OpenEnv servers as an agent environment (``env.name: openenv``).

`OpenEnv <https://github.com/huggingface/OpenEnv>`_ serves an environment behind HTTP and a WebSocket:
``reset`` starts an episode, ``step(action)`` returns an observation with its reward and ``done``. This
adapter plays one posttrain episode as one OpenEnv session, through openenv's own client
(``GenericEnvClient(...).sync()``: one WebSocket, so one environment instance on the server, per
episode); it never speaks the protocol itself.

**Versions.** The client is the installed package's: ``openenv`` 0.10 (what set-up installs) or the older
``openenv-core`` 0.3.0 (both are the module ``openenv``, so one is installed at a time); either speaks to
servers of either (tests/agents/test_openenv_env.py, all four pairings). The one difference this adapter
sees: 0.10's server sends an observation's ``metadata`` inside it, 0.3.0's leaves it out.

    env.name: openenv
    env.options: {url: http://127.0.0.1:8000, action_field: message}

- **Reset.** The row's prompt is the first user message; the server's reset observation (as text,
  below) follows it when not empty. Reset arguments: ``reset_options`` (e.g. ``{seed: 3}``), updated
  with the row's ``extra_info["openenv_reset"]``, so that each row can pick its own episode.
- **Action.** The agent turn's text, whole, is the value of the action's field ``action_field``
  (default ``message``: echo_env's and textarena's field; ``code`` for coding_env): the action sent is
  ``{action_field: text}``. An action whose other fields are required cannot be filled from text:
  :meth:`OpenEnvEnv.before_training` refuses it, reading the server's ``/schema``.
- **Observation.** The server's observation (its fields but ``reward``, ``done`` and ``metadata``, which
  are never shown) becomes the next user message: the field ``observation_field`` when set; else the
  only field when there is one; else all the fields as JSON. Text values are shown as they are, others
  as JSON.
- **Reward and done** are the server's, as it returned them (a ``None`` reward counts 0). The episode
  ends when the server says ``done`` or on the loop's turn budget. ``success`` (``reward_extra/acc``)
  is a step reward at least ``success_reward`` when that is set, never otherwise.
- **A refused action** (the server answered with an error: the action did not validate, or the
  environment's ``step`` raised) is an invalid turn, not an error: its observation is the server's
  message, its reward ``invalid_action_penalty``; counted as ``server_refusals``.
- **A server that is gone** (no connection, the session's socket closed, no answer within
  ``message_timeout_s``) raises :class:`OpenEnvServerLost`, a :class:`~posttrain.errors.ProcessLost`:
  the episode's state died with the session, so the batch is not trained on (the other sessions on that
  server close without waiting for it); the run stops, or
  with ``trainer.max_restarts`` starts again from its last checkpoint (a supervised server that came
  back is used again; one still down fails the next attempt the same way, at once).
- **Refused before any worker starts:** no ``url``, or one that is not ``http(s)://`` or ``ws(s)://``
  with a host (the config check); before step 1, a server that does not answer ``/health``, an
  ``action_field`` that is not a text field of its action, and an ``observation_field`` it does not
  have. A server that holds fewer sessions than a batch has episodes is refused at its first reset
  (``max_concurrent_envs`` of openenv's ``create_app``).

``step_batch`` steps every episode of a round at once (a thread per episode, up to
:data:`MAX_PARALLEL_STEPS`, each waiting on its own session), so a round takes the slowest step, not the
sum. Resets and the forced final turns (the agent loop's ``finish``) go one episode after another.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, ClassVar
from urllib.parse import urlsplit

from posttrain.agents.env import EpisodeSample, Environment, StepInfo, StepResult
from posttrain.errors import InputError, PosttrainError, ProcessLost
from posttrain.install import install_line

if TYPE_CHECKING:
    from posttrain.config.schema import EnvConfig

logger = logging.getLogger(__name__)

RESET_KEY = "openenv_reset"  # a row's extra_info entry: its reset arguments
MAX_PARALLEL_STEPS = 64
INSTALL = f"`{install_line('openenv')}` (`posttrain setup` does this)"
# openenv's client raises RuntimeError(f"Server error: {message} (code: {code})") for the server's error replies
_SERVER_ERROR = re.compile(r"^Server error: (?P<message>.*) \(code: (?P<code>[A-Z_]+)\)$", re.DOTALL)
# the urls of servers an episode of this process found gone, until a reset there succeeds again: the other
# episodes' sessions on them close without waiting (a frozen server holds each close for 10 s, one after another)
_lost_urls: set[str] = set()
# an observation's fields that are not shown: openenv 0.3.0 leaves metadata out of the observation it sends, 0.10 keeps it in
_NOT_SHOWN = frozenset({"reward", "done", "metadata"})


def row_reset_arguments(extra_info: dict[str, Any]) -> dict[str, Any]:
    """A row's reset arguments, ``extra_info["openenv_reset"]``: JSON text of an object (what rows of
    different argument names should hold), or a mapping, whose ``None`` values are dropped: a parquet file
    gives every row the fields any row has, ``None`` where it had none."""
    value = extra_info.get(RESET_KEY)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise InputError(f"extra_info[{RESET_KEY!r}] = {value!r} is not JSON text of an object ({err})") from None
    if value is not None and not isinstance(value, Mapping):
        raise InputError(f"extra_info[{RESET_KEY!r}] = {value!r}: the row's reset arguments must be an object of name → value")
    return {name: argument for name, argument in (value or {}).items() if argument is not None}


class OpenEnvServerLost(ProcessLost):
    """The OpenEnv server of ``env.options.url`` went away during an episode (restartable: module docstring)."""


class _Refused(PosttrainError):
    """The server answered with an error reply (the action is invalid, the session lives); never leaves this module."""


class OpenEnvEnv(Environment):
    """One episode as one session of the OpenEnv server at ``url``; see the module docstring."""

    name: ClassVar[str] = "openenv"
    counters: ClassVar[tuple[str, ...]] = ("server_refusals",)

    def __init__(
        self,
        url: str | None = None,
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        reset_options: Mapping[str, Any] | None = None,
        stop: Sequence[str] = (),
        success_reward: float | None = None,
        invalid_action_penalty: float = 0.0,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        self.url = _checked_url(url)
        problems = [f"{name}={value} must be > 0" for name, value in
                    (("connect_timeout_s", connect_timeout_s), ("message_timeout_s", message_timeout_s)) if not value > 0]
        if not invalid_action_penalty <= 0:
            problems.append(f"invalid_action_penalty={invalid_action_penalty} is a reward added per refused action, so it must be <= 0")
        if not action_field:
            problems.append("action_field must name the action's text field (e.g. message, code)")
        if problems:
            raise InputError("OpenEnvEnv options: " + "; ".join(problems))
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_options = dict(reset_options or {})
        self.stop = (stop,) if isinstance(stop, str) else tuple(stop)
        self.success_reward, self.invalid_action_penalty = success_reward, invalid_action_penalty
        self.connect_timeout_s, self.message_timeout_s = connect_timeout_s, message_timeout_s
        self._client_class = _generic_client_class()
        self._session: Any = None  # openenv's SyncEnvClient of this episode
        self._lost = False  # the session's server went away (OpenEnvServerLost)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.stop

    @classmethod
    def before_training(cls, env: EnvConfig, resources: Mapping[str, Any], samples: Iterable[EpisodeSample]) -> None:
        """The server answers ``/health``, and its ``/schema`` has the fields the options name."""
        cls(**env.options).check_server()

    def check_server(self) -> None:
        """Raise :class:`InputError` unless the server is up and its action and observation fit the options."""
        import httpx

        base = re.sub(r"^ws", "http", self.url.rstrip("/"))
        try:
            httpx.get(f"{base}/health", timeout=self.connect_timeout_s).raise_for_status()
            schema = httpx.get(f"{base}/schema", timeout=self.connect_timeout_s).raise_for_status().json()
            if not isinstance(schema, dict):
                raise ValueError(f"its /schema is a JSON {type(schema).__name__}, not OpenEnv's schema")
        except (httpx.HTTPError, ValueError) as error:  # ValueError: a /schema that is not OpenEnv's JSON (another service)
            raise InputError(f"no OpenEnv server answers at env.options.url={self.url!r} ({error}); start it "
                             "(e.g. uvicorn on openenv's create_app) or fix the url") from error
        action = schema.get("action", {})
        fields = action.get("properties", {})
        text_fields = sorted(name for name, spec in fields.items() if _is_text(spec))
        if self.action_field not in text_fields:
            raise InputError(f"env.options.action_field={self.action_field!r} is not a text field of the action of the OpenEnv server "
                             f"at {self.url} (its text fields: {text_fields or 'none'}); set env.options.action_field to one of them")
        others = sorted(set(action.get("required", ())) - {self.action_field})
        if others:
            raise InputError(f"the action of the OpenEnv server at {self.url} also requires {others}, which posttrain cannot fill "
                             f"from the model's text (it sends {{{self.action_field!r}: text}} only)")
        observed = sorted(set(schema.get("observation", {}).get("properties", {})) - _NOT_SHOWN)
        if self.observation_field is not None and self.observation_field not in observed:
            raise InputError(f"env.options.observation_field={self.observation_field!r} is not a field of the observation of the "
                             f"OpenEnv server at {self.url} (its fields: {observed})")

    def reset(self, sample: EpisodeSample) -> str:
        self.close()
        self._lost = False
        self._session = self._client_class(
            base_url=self.url, connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.message_timeout_s,
        ).sync()
        arguments = {**self.reset_options, **row_reset_arguments(sample.extra_info)}
        try:
            result = self._call("reset", lambda: self._session.reset(**arguments))
        except _Refused as refused:
            raise InputError(f"the OpenEnv server at {self.url} refused to reset with {arguments} "
                             f"(env.options.reset_options, the row's extra_info[{RESET_KEY!r}]): {refused}") from None
        _lost_urls.discard(self.url)
        return self._text(result.observation)

    def step(self, action: str) -> StepResult:
        if self._session is None:
            raise RuntimeError("OpenEnvEnv.step before reset: call reset(sample) to open the episode's session")
        try:
            result = self._call("step", lambda: self._session.step({self.action_field: action}))
        except _Refused as refused:
            observation = f"The environment refused the action: {refused}"
            return StepResult(observation, self.invalid_action_penalty, False, StepInfo(False, False, counts={"server_refusals": 1}))
        reward = float(result.reward or 0.0)
        success = self.success_reward is not None and reward >= self.success_reward
        return StepResult(self._text(result.observation), reward, bool(result.done), StepInfo(True, True, success))

    def close(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        if self._lost or self.url in _lost_urls:  # a frozen server would hold each close for websockets' close timeout (10 s)
            threading.Thread(target=self._close_session, args=(session,), name="openenv-close", daemon=True).start()
        else:
            self._close_session(session)

    def _close_session(self, session: Any) -> None:
        try:
            session.close()
        except Exception as error:  # noqa: BLE001 - a session of a server that is gone closes as well as it can
            logger.debug("closing an OpenEnv session at %s: %s", self.url, error)

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        """Every episode's step at once; the first error (in episode order) is raised once all are answered."""
        if len(envs) < 2:
            return super().step_batch(envs, actions)
        with ThreadPoolExecutor(max_workers=min(len(envs), MAX_PARALLEL_STEPS), thread_name_prefix="openenv-step") as pool:
            return list(pool.map(lambda env, action: env.step(action), envs, actions))

    def _call(self, what: str, request: Callable[[], Any]) -> Any:
        """``request()``; the server's error reply raises :class:`_Refused`, a full server :class:`InputError`,
        a lost connection :class:`OpenEnvServerLost`."""
        from websockets.exceptions import ConnectionClosedOK, WebSocketException

        try:
            return request()
        except RuntimeError as error:
            reply = _SERVER_ERROR.match(str(error))
            if reply is None:
                raise
            if reply["code"] in ("CAPACITY_REACHED", "FACTORY_ERROR"):
                raise self._no_session(f"{reply['message']} ({reply['code']})") from None
            raise _Refused(f"{reply['message']} ({reply['code']})") from None
        except ConnectionClosedOK as error:
            if what == "reset":  # closed by the server on purpose as the session opened: its error reply is lost in the close
                raise self._no_session(f"it closed the new session at once: {error}") from None
            raise self._lost_server(what, error) from error
        except (OSError, WebSocketException) as error:  # ConnectionError and TimeoutError are OSErrors
            raise self._lost_server(what, error) from error

    def _no_session(self, reason: str) -> InputError:
        return InputError(f"the OpenEnv server at {self.url} gave no session to a new episode ({reason}): each episode of a batch "
                          "holds one session at once, so serve it with max_concurrent_envs (openenv's create_app) at least the "
                          "episodes of a batch (data.train_batch_size x actor_rollout_ref.rollout.n, and the validation batch), "
                          "and check that its environment can be created (its log)")

    def _lost_server(self, what: str, error: BaseException) -> OpenEnvServerLost:
        self._lost = True
        _lost_urls.add(self.url)
        return OpenEnvServerLost(
            f"the OpenEnv server at {self.url} (env.options.url) went away during an episode's {what}: "
            f"{type(error).__name__}: {str(error) or f'no answer within message_timeout_s={self.message_timeout_s}'}. "
            "The episode's state was in that session, so this batch is not trained on; check the server "
            "(trainer.max_restarts restarts the run from its last checkpoint)."
        )

    def _text(self, observation: Mapping[str, Any]) -> str:
        """The observation shown to the agent (module docstring)."""
        observation = {name: value for name, value in observation.items() if name not in _NOT_SHOWN}
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise InputError(f"env.options.observation_field={self.observation_field!r} is not in the observation of the OpenEnv "
                                 f"server at {self.url} (its fields: {sorted(observation)})")
            value = observation[self.observation_field]
        elif len(observation) == 1:
            value = next(iter(observation.values()))
        else:
            value = dict(observation)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _checked_url(url: str | None) -> str:
    if not url:
        raise InputError("env.name=openenv needs env.options.url: the address of a running OpenEnv server "
                         "(e.g. env.options.url=http://127.0.0.1:8000)")
    parts = urlsplit(str(url))
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise InputError(f"env.options.url={url!r} is not the address of an OpenEnv server: give http://HOST:PORT "
                         "(or https://, ws://, wss://)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as error:
        raise InputError(f"env.options.url={url!r}: {error}") from None
    return str(url)


def _is_text(spec: Mapping[str, Any]) -> bool:
    """A JSON-schema field that takes a string (``{"type": "string"}``, or ``anyOf`` one)."""
    return spec.get("type") == "string" or any(option.get("type") == "string" for option in spec.get("anyOf", ()))


def _generic_client_class() -> type:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as error:
        raise InputError(f"env.name=openenv needs the OpenEnv client (the package openenv): {error}; {INSTALL}") from error
    return GenericEnvClient
