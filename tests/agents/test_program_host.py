"""Agent programs run per episode in processes forked from one host (agents/program_host.py), talking to
the program endpoint: what each returns comes back in order; one that raises, hangs, crashes or returns
something that is not a score costs only its own episode; a bad entry is refused with the reason."""

import textwrap
import time
from pathlib import Path

import pytest
from tests.optional import require

require("openai", 'the openai SDK is installed by scripts/setup.sh (pip install -e ".[dev]")')

from posttrain.agents import TurnOutput  # noqa: E402
from posttrain.agents.program_host import ProgramError, ProgramHost, load_program, program_score  # noqa: E402
from posttrain.models import cached_tiny_model, load_tokenizer  # noqa: E402
from posttrain.models.tool_formats import make_tool_format  # noqa: E402
from posttrain.rollout.endpoint import EndpointSettings, ProgramEndpoint  # noqa: E402

PROGRAMS = '''
import os, time

async def asks_twice(client, row):
    messages = list(row["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return {"score": float(row["ground_truth"]), "acc": second.choices[0].message.content == "ok"}

def plain(client, row):
    reply = client.chat.completions.create(model="policy", messages=row["messages"])
    return 0.5 if os.environ["OPENAI_BASE_URL"] == str(client.base_url).rstrip("/") else -1.0

def raises(client, row):
    raise RuntimeError("my agent broke")

def hangs(client, row):
    time.sleep(600)

def crashes(client, row):
    os._exit(3)

def not_a_score(client, row):
    return "great"

def three(client, row, extra):
    return 1.0

def mixed(client, row):
    kind = row["ground_truth"]
    if kind == "0":
        client.chat.completions.create(model="policy", messages=row["messages"])
        return 1.0
    if kind == "1":
        raise ValueError("row 1 fails")
    if kind == "2":
        os._exit(3)
    time.sleep(600)

def writes_its_pid(client, row):
    open(row["extra_info"]["pid_file"] + row["ground_truth"], "w").write(str(os.getpid()))
    time.sleep(600)

def leaves_a_child(client, row):
    import subprocess
    child = subprocess.Popen(["sleep", "600"])
    open(row["extra_info"]["pid_file"], "w").write(str(child.pid))
    time.sleep(600)
'''


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    path = tmp_path_factory.mktemp("programs") / "my_agent.py"
    path.write_text(textwrap.dedent(PROGRAMS))
    return path


@pytest.fixture(scope="module")
def endpoint():
    tokenizer = load_tokenizer(cached_tiny_model("llama", seed=0))
    ok = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(contexts, max_new_tokens, stop, request_keys):
        return [TurnOutput(list(ok), [-0.1] * len(ok), "stop", 0) for _ in contexts]

    served = ProgramEndpoint(generate, tokenizer, make_tool_format("auto", tokenizer),
                             EndpointSettings(model="policy", max_turn_tokens=8, max_response_length=100))
    with served.serving():
        yield served


def run(endpoint, programs, name, count=2, deadline_s=60.0, extra_info=None):
    host = ProgramHost(f"{programs}:{name}")
    try:
        keys = [f"{name}-{i}" for i in range(count)]
        rows = [{"messages": [{"role": "user", "content": f"question {i}"}], "ground_truth": str(i), "data_source": "x", "extra_info": extra_info or {}}
                for i in range(count)]
        outcomes = host.run([(endpoint.open(key), row) for key, row in zip(keys, rows)], deadline_s)
        return outcomes, [endpoint.close(key) for key in keys]
    finally:
        host.close()


def test_each_episode_runs_its_own_program_and_its_return_comes_back_in_order(endpoint, programs):
    outcomes, episodes = run(endpoint, programs, "asks_twice", count=3)
    assert [o.value for o in outcomes] == [{"score": float(i), "acc": True} for i in range(3)]
    assert [(len(e.samples), e.requests, e.prefix_breaks) for e in episodes] == [(1, 2, 0)] * 3
    outcomes, episodes = run(endpoint, programs, "plain")
    assert [o.value for o in outcomes] == [0.5, 0.5] and all(e.requests == 1 for e in episodes)


@pytest.mark.parametrize("name, kind, message", [
    ("raises", "error", "RuntimeError: my agent broke"),
    ("crashes", "died", "died without an answer"),
    ("not_a_score", "error", "return a finite number"),
    ("hangs", "timed_out", "still running at its deadline (3 s)"),
])
def test_a_program_that_fails_costs_its_own_episode_only(endpoint, programs, name, kind, message):
    started = time.monotonic()
    outcomes, _ = run(endpoint, programs, name, deadline_s=3.0)
    assert all(not o.ok and message in o.error for o in outcomes)
    assert all(getattr(o, kind) for o in outcomes) if kind != "error" else all(not (o.died or o.timed_out) for o in outcomes)
    assert time.monotonic() - started < 30


def test_episodes_that_fail_beside_ones_that_succeed_cost_only_themselves(endpoint, programs):
    outcomes, episodes = run(endpoint, programs, "mixed", count=4, deadline_s=4.0)
    assert outcomes[0].ok and outcomes[0].value == 1.0 and episodes[0].requests == 1
    assert "row 1 fails" in outcomes[1].error and not (outcomes[1].died or outcomes[1].timed_out)
    assert outcomes[2].died and outcomes[3].timed_out


def test_what_a_program_started_is_killed_with_it_at_its_deadline(endpoint, programs, tmp_path):
    pid_file = tmp_path / "pid"
    outcomes, _ = run(endpoint, programs, "leaves_a_child", count=1, deadline_s=3.0, extra_info={"pid_file": str(pid_file)})
    assert outcomes[0].timed_out
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_stopping_the_host_mid_run_stops_its_episodes_and_the_host_takes_a_new_run_after(endpoint, programs, tmp_path):
    """The controller stops the host while its episodes run (Ctrl-C, a restart): the episodes go with it
    (each leads its own process group, so the host's group does not hold them)."""
    import threading

    host = ProgramHost(f"{programs}:writes_its_pid")
    rows = [{"messages": [{"role": "user", "content": "q"}], "ground_truth": str(i), "data_source": "x",
             "extra_info": {"pid_file": str(tmp_path / "pid")}} for i in range(2)]
    keys = [f"stopped-{i}" for i in range(2)]
    done = []
    worker = threading.Thread(target=lambda: done.append(host.run([(endpoint.open(k), row) for k, row in zip(keys, rows)], 60.0)))
    worker.start()
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"pid{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int((tmp_path / f"pid{i}").read_text()) for i in range(2)]
    host.close()
    worker.join(30)
    for key in keys:
        endpoint.close(key)
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids), "an episode outlived the host that ran it"
    assert done and all(o.died for o in done[0])  # the run that was stopped reports its episodes lost
    outcomes, _ = run(endpoint, programs, "plain")  # and a new host serves the next run
    assert [o.value for o in outcomes] == [0.5, 0.5]


def test_bad_entries_are_refused_with_the_reason(programs, tmp_path):
    with pytest.raises(ProgramError, match="exactly two arguments"):
        load_program(f"{programs}:three")
    with pytest.raises(ProgramError, match="has no function 'missing'.*asks_twice"):
        load_program(f"{programs}:missing")
    with pytest.raises(ProgramError, match="no such file"):
        load_program(f"{tmp_path}/nowhere.py:rollout")
    with pytest.raises(ProgramError, match="FILE.py:FUNCTION"):
        load_program("rollout")


def test_a_return_is_a_score_an_acc_or_none():
    assert program_score(None) == (None, None)
    assert program_score(2) == (2.0, None) and program_score({"score": 0.5, "acc": 1}) == (0.5, True)
    for bad in ("1", True, float("nan"), {"acc": 1}):
        with pytest.raises(ValueError):
            program_score(bad)


def test_the_options_of_env_name_program_are_checked_when_built(programs):
    from posttrain.agents.program_host import ProgramEnv

    assert ProgramEnv(entry=f"{programs}:plain").deadline_s == 300.0
    for options, message in (({}, "exactly one of"), ({"entry": f"{programs}:plain", "command": "x"}, "exactly one of"),
                             ({"entry": f"{programs}:plain", "deadline_s": float("inf")}, "finite number of seconds"),
                             ({"entry": f"{programs}:plain", "deadline_s": 0}, r"\(> 0\)"),
                             ({"entry": f"{programs}:plain", "use_retriever": "false"}, "give true or false"),
                             ({"command": "  "}, "command is empty")):
        with pytest.raises(ProgramError, match=message):
            ProgramEnv(**options)
