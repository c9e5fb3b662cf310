"""``env.name: openenv`` against a real OpenEnv server (tests/agents/openenv_server.py: openenv's own
``Environment`` and ``create_app`` under uvicorn, in a process of its own), driven by the agent loop with
a scripted engine.

The client is the installed openenv; so is the server, unless ``OPENENV_SERVER_SITE`` names a folder
holding another one, which the server processes import first. The four pairings of ``openenv`` 0.10.0
(installed) and ``openenv-core`` 0.3.0::

    pip install --no-deps --target /tmp/oe03 openenv-core==0.3.0
    pip install --no-deps --target /tmp/oe10 openenv==0.10.0
    pytest tests/agents/test_openenv_env.py                                    # 0.10 client, 0.10 server
    OPENENV_SERVER_SITE=/tmp/oe03 pytest tests/agents/test_openenv_env.py      # 0.10 client, 0.3.0 server
    PYTHONPATH=/tmp/oe03:. OPENENV_SERVER_SITE=/tmp/oe10 pytest tests/...      # 0.3.0 client, 0.10 server
    PYTHONPATH=/tmp/oe03:. pytest tests/agents/test_openenv_env.py             # 0.3.0 client, 0.3.0 server
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from posttrain.agents import openenv_env
from tests.optional import require

require("openenv.core.generic_client", openenv_env.INSTALL)

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, run_episodes  # noqa: E402
from posttrain.agents.openenv_env import OpenEnvEnv, OpenEnvServerLost  # noqa: E402
from posttrain.rollout.environments import load_env_class  # noqa: E402
from posttrain.agents.retriever.process import free_port  # noqa: E402
from posttrain.cli.preflight import check_environment  # noqa: E402
from posttrain.config import load_config  # noqa: E402
from posttrain.errors import InputError, is_restartable  # noqa: E402
from tests.agents.retriever_helpers import serve_in_thread  # noqa: E402
from tests.agents.test_loop import ScriptedEngine  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]


def _start_server(max_sessions: int) -> tuple[subprocess.Popen, str]:
    """The game served in a process of its own (to be killed or frozen), from the openenv of
    ``OPENENV_SERVER_SITE`` when set (module docstring); returns (process, url) once it answers."""
    environment, site = dict(os.environ), os.environ.get("OPENENV_SERVER_SITE")
    if site:
        if not (Path(site) / "openenv").is_dir():
            pytest.fail(f"OPENENV_SERVER_SITE={site} holds no openenv package: pip install --no-deps --target {site} openenv==...")
        environment["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), environment.get("PYTHONPATH", "")])
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.agents.openenv_server", str(port), str(max_sessions)],
                               cwd=ROOT, env=environment)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1).raise_for_status()
            return process, url
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the OpenEnv test server did not start (exit code {process.poll()})")
            time.sleep(0.1)


def _stop_server(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGCONT)  # a frozen one too
    process.kill()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def game_url():
    """The game, with room for two sessions at once."""
    process, url = _start_server(max_sessions=2)
    yield url
    _stop_server(process)


def _episodes(tokenizer, seeds: list[int]) -> tuple[list[EpisodeSample], list[list[int]]]:
    """One row per seed: the prompt names the episode (for ScriptedEngine), the row picks its secret."""
    samples = [EpisodeSample([{"role": "user", "content": f"episode {k}"}], None, extra_info={"openenv_reset": {"seed": seed}})
               for k, seed in enumerate(seeds)]
    prompts = [list(tokenizer.apply_chat_template(s.prompt, add_generation_prompt=True, tokenize=True, return_dict=False)) for s in samples]
    return samples, prompts


def _play(tokenizer, envs, seeds, scripts, generate=None):
    samples, prompts = _episodes(tokenizer, seeds)
    engine = generate or ScriptedEngine(tokenizer, prompts, scripts)
    config = AgentLoopConfig(max_response_length=512, max_turns=6, max_turn_tokens=16, max_obs_length=64)
    return run_episodes(envs, samples, prompts, engine, ObservationRenderer(tokenizer), config)


def test_a_round_trip_gives_what_the_server_produced(tokenizer, game_url):
    """Two concurrent episodes, each its own session (secrets 3 and 8): every reward, observation and
    ``done`` is the server's; a guess that is not a number is the server's refusal, an invalid turn.
    The server holds two sessions: the second batch plays only if the first closed its sessions."""
    for _ in range(2):
        envs = [OpenEnvEnv(game_url, observation_field="feedback", success_reward=1.0, invalid_action_penalty=-0.5) for _ in range(2)]
        long, short = _play(tokenizer, envs, [13, 8], [["5", "x", "1", "3"], ["8"]])
        assert long.turn_rewards == [-0.1, -0.5, -0.1, 1.0]
        assert long.observations[0] == "lower" and long.observations[2] == "higher"
        assert long.observations[1].startswith("The environment refused the action: invalid literal for int()")
        assert long.observations[1].endswith("(EXECUTION_ERROR)")
        assert (long.done, long.num_turns, long.valid_actions, long.counts["server_refusals"], long.success) == (True, 4, 3, 1, True)
        assert (short.turn_rewards, short.num_turns, short.success) == ([1.0], 1, True)
    # the reset observation follows the row's prompt; the observations are user turns, masked out
    assert long.prompt_messages[-1] == {"role": "user", "content": "Guess a number from 0 to 9."}
    masked = tokenizer.decode([t for t, m in zip(long.response_ids, long.loss_mask) if not m])
    assert "user\nlower<|im_end|>" in masked and "user\nhigher<|im_end|>" in masked


def test_the_whole_observation_is_json_and_the_turn_budget_ends_an_episode(tokenizer, game_url):
    """All the observation's fields but its metadata (the secret: openenv 0.10's server sends it inside the observation)."""
    episode, = _play(tokenizer, [OpenEnvEnv(game_url, reset_options={"seed": 1})], [2], [["0"] * 9])
    assert episode.prompt_messages[-1]["content"] == '{"feedback": "Guess a number from 0 to 9.", "guesses": 0}'
    assert episode.observations[0] == '{"feedback": "higher", "guesses": 1}'
    assert episode.num_turns == 7 and episode.forced_final and episode.turn_rewards == [-0.1] * 7
    assert not episode.success  # no success_reward: success is never claimed


def test_reward_done_and_metadata_are_never_shown_and_do_not_count_as_fields():
    """Whichever openenv served it: a lone field is shown as it is, several as JSON, without those three."""
    env = OpenEnvEnv("http://127.0.0.1:1")
    assert env._text({"feedback": "higher", "metadata": {"secret": 3}, "reward": -0.1, "done": False}) == "higher"
    assert env._text({"feedback": "higher", "guesses": 1, "metadata": {}}) == '{"feedback": "higher", "guesses": 1}'


@pytest.mark.parametrize(("options", "message"), [
    ({}, "env.name=openenv needs env.options.url"),
    ({"url": "localhost:8000"}, "is not the address of an OpenEnv server"),
    ({"url": "http://127.0.0.1:port"}, "Port could not be cast"),
    ({"url": "http://127.0.0.1:1", "message_timeout_s": 0}, "message_timeout_s=0 must be > 0"),
])
def test_the_config_check_refuses_a_missing_or_bad_url(options, message):
    overrides = ["env.name=openenv", *(f"env.options.{key}={value}" for key, value in options.items())]
    problems = check_environment(load_config([], overrides, checks=None))
    assert len(problems) == 1 and problems[0].key == "env.options"
    assert message in problems[0].message
    assert load_env_class("openenv") is OpenEnvEnv


def test_before_training_reads_the_servers_health_and_schema(game_url):
    config = load_config([], ["env.name=openenv", f"env.options.url={game_url}"], checks=None).env
    OpenEnvEnv.before_training(config, {}, [])  # message is the action's text field
    with pytest.raises(InputError, match=r"action_field='code' is not a text field .* \(its text fields: \['message'\]\)"):
        OpenEnvEnv(game_url, action_field="code").check_server()
    with pytest.raises(InputError, match=r"observation_field='board' is not a field .* \(its fields: \['feedback', 'guesses'\]\)"):
        OpenEnvEnv(game_url, observation_field="board").check_server()
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InputError, match=f"no OpenEnv server answers at env.options.url='{nobody}'"):
        OpenEnvEnv(nobody, connect_timeout_s=2).check_server()


def test_before_training_refuses_another_service_that_answers_health():
    """A url that names another web service (healthy, but its /schema is a web page) is refused with the fix, not a traceback."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})
    app.get("/schema", response_class=HTMLResponse)(lambda: "<html>a web app</html>")
    url, stop = serve_in_thread(app)
    try:
        with pytest.raises(InputError, match=f"no OpenEnv server answers at env.options.url='{url}'.*fix the url"):
            OpenEnvEnv(url).check_server()
    finally:
        stop()


def test_a_server_with_fewer_sessions_than_episodes_is_refused_with_the_fix():
    process, url = _start_server(max_sessions=1)
    first, second = OpenEnvEnv(url), OpenEnvEnv(url)
    try:
        first.reset(EpisodeSample([], None))
        with pytest.raises(InputError, match=r"gave no session to a new episode .*max_concurrent_envs") as caught:
            second.reset(EpisodeSample([], None))
        assert not is_restartable(caught.value)  # a restart would meet the same full server
    finally:
        first.close(), second.close()
        _stop_server(process)


@pytest.fixture
def server_process():
    """The game in a process of this test alone, to be killed or frozen; yields (process, url)."""
    process, url = _start_server(max_sessions=8)
    yield process, url
    _stop_server(process)


def _dies_at_second_turn(tokenizer, seeds, scripts, kill):
    """A scripted engine that does ``kill()`` once its first turn is answered (mid-episode)."""
    engine = ScriptedEngine(tokenizer, _episodes(tokenizer, seeds)[1], scripts)

    def generate(contexts, max_new_tokens, stop, request_keys):
        if request_keys[0].endswith(":1"):  # "<episode>:<turn>"
            kill()
        return engine(contexts, max_new_tokens, stop, request_keys)

    return generate


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_server_that_goes_away_mid_episode_is_a_restartable_failure_not_a_hang(tokenizer, server_process, how):
    """Killed (the socket closes) or frozen (SIGSTOP: no answer within message_timeout_s): the loop
    raises OpenEnvServerLost naming the url, a ProcessLost that trainer.max_restarts restarts from."""
    process, url = server_process
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    envs = [OpenEnvEnv(url, message_timeout_s=3) for _ in range(2)]
    generate = _dies_at_second_turn(tokenizer, [1, 2], [["0", "0"], ["0", "0"]], lambda: os.kill(process.pid, sig))
    started = time.monotonic()
    with pytest.raises(OpenEnvServerLost, match=f"the OpenEnv server at {url} \\(env.options.url\\) went away during an episode's step") as caught:
        _play(tokenizer, envs, [1, 2], None, generate=generate)
    assert time.monotonic() - started < 20  # message_timeout_s, not websockets' keepalive (~40 s), ends a frozen session
    assert is_restartable(caught.value)
    assert all(env._session is None for env in envs)  # closed on the way out


def test_once_a_frozen_server_is_found_gone_no_other_session_waits_to_close(server_process):
    """Episodes reset before the server froze hold sessions that never failed themselves; once one episode
    finds the server gone, closing them does not wait websockets' close timeout (10 s each, one by one)."""
    process, url = server_process
    envs = [OpenEnvEnv(url, connect_timeout_s=2, message_timeout_s=2) for _ in range(3)]
    envs[0].reset(EpisodeSample([], None)), envs[1].reset(EpisodeSample([], None))
    os.kill(process.pid, signal.SIGSTOP)
    with pytest.raises(OpenEnvServerLost, match="went away during an episode's reset"):
        envs[2].reset(EpisodeSample([], None))
    started = time.monotonic()
    for env in envs:
        env.close()
    assert time.monotonic() - started < 2  # not 2 x 10 s
    os.kill(process.pid, signal.SIGCONT)  # back: a reset succeeds, and sessions close as before
    again = OpenEnvEnv(url)
    again.reset(EpisodeSample([], None))
    assert url not in openenv_env._lost_urls
    again.close()


def test_a_rows_reset_arguments_survive_parquet_whether_json_text_or_a_mapping(tmp_path):
    """Parquet gives every row the fields any row has (None elsewhere): those are not sent to reset;
    JSON text keeps each row's own arguments as written; anything else is refused with the key's name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"openenv_reset": {"seed": 3}}, {"openenv_reset": {"difficulty": "hard"}}, {"openenv_reset": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    read = pq.read_table(tmp_path / "rows.parquet").to_pylist()
    assert read[0]["openenv_reset"] == {"seed": 3, "difficulty": None}  # what parquet does to the mappings
    assert [openenv_env.row_reset_arguments(row) for row in read] == [{"seed": 3}, {"difficulty": "hard"}, {}]
    assert openenv_env.row_reset_arguments({"openenv_reset": '{"seed": 3, "level": null}'}) == {"seed": 3}
    for bad in ("seed=3", "[3]", 3):
        with pytest.raises(InputError, match="openenv_reset"):
            openenv_env.row_reset_arguments({"openenv_reset": bad})
