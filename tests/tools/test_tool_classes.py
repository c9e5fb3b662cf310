"""Tool classes (docs/tools.md "Tool classes"): a user's class (tests/tools/warehouse.py) whose typed,
documented methods are tools, one instance per episode, each episode's in a process of its own, played
by the agent loop as a GRPO group plays one row: the same row, the same prompt, four episodes."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from posttrain.agents import AgentLoopConfig, EpisodeAnswer, EpisodeSample, ObservationRenderer, TurnOutput, episode_metrics, run_episodes
from posttrain.cli.main import main
from posttrain.metrics import total
from posttrain.models import cached_tiny_model, tokenize_prompts
from posttrain.models.tool_formats.builtin import BuiltinFormat
from posttrain.rewards.manager import Answer, RewardManager
from posttrain.tools import ToolBox, ToolSpecError, load_tools
from posttrain.tools.env import ToolEnv
from posttrain.tools.instances import InstancePool
from posttrain.tools.load import ToolClass

WAREHOUSE = f"{Path(__file__).parent / 'warehouse.py'}:Warehouse"


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class GroupEngine:
    """tests/agents/test_loop.py's ScriptedEngine for episodes of one row: their prompts are the same, so
    an episode is known by its context, which begins with what it was sent and sampled before (the
    first turn's identical contexts go to the episodes in the loop's order). Episode k's turn t is
    ``scripts[k][t]`` and eos; ``on_turn`` runs before each round."""

    def __init__(self, tokenizer, scripts: list[list[str]], on_turn=lambda: None) -> None:
        self.tokenizer, self.scripts, self.on_turn = tokenizer, scripts, on_turn
        self.before: list[list[int]] = [[] for _ in scripts]  # each episode's last context and the turn sampled after it
        self.turns = [0] * len(scripts)

    def __call__(self, contexts, max_new_tokens, stop, request_keys):
        self.on_turn()
        taken, outputs = set(), []
        for context in contexts:
            k = next(k for k in range(len(self.scripts)) if k not in taken and list(context[: len(self.before[k])]) == self.before[k])
            taken.add(k)
            text = self.scripts[k][min(self.turns[k], len(self.scripts[k]) - 1)]
            self.turns[k] += 1
            tokens = (self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id])[:max_new_tokens]
            self.before[k] = list(context) + tokens
            outputs.append(TurnOutput(tokens, [-0.1] * len(tokens), "stop"))
        return outputs


def descendants() -> set[int]:
    """The live processes below this one (but multiprocessing's resource tracker, which lives as long as this process)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def toolbox(tokenizer, specs, max_chars: int = 20_000, **options) -> ToolBox:
    tools = load_tools(specs, max_chars)
    return ToolBox(tools, tool_format=BuiltinFormat(tokenizer, [t.schema for t in tools], "hermes"), **({"timeout_s": 2.0, "max_calls": 8} | options))


def play_group(tokenizer, box, scripts, scratch: Path, *, truth: str = "0", on_turn=lambda: None):
    """len(scripts) episodes of one row (3 apples, 1 pear; ``truth`` apples should be left)."""
    row = EpisodeSample([{"role": "user", "content": "Ship the apples."}], truth, "fruit",
                        {"stock": {"apple": 3, "pear": 1}, "scratch_dir": str(scratch), "index": 7})
    prompt = tokenize_prompts([row.prompt], tokenizer, box.schemas)[0]
    config = AgentLoopConfig(max_response_length=2048, max_turns=4, max_turn_tokens=96, max_obs_length=256)
    envs = [ToolEnv(box) for _ in scripts]
    engine = GroupEngine(tokenizer, scripts, on_turn)
    return run_episodes(envs, [row] * len(scripts), [prompt] * len(scripts), engine, ObservationRenderer(tokenizer, "user"), config)


def ledgers(scratch: Path) -> list[Path]:
    return sorted(scratch.glob("ledger-*"))


def test_each_episode_of_a_group_has_its_own_instance_and_reward(tokenizer, tmp_path):
    before = descendants()
    box = toolbox(tokenizer, [WAREHOUSE])
    seen: list[list[Path]] = []
    count = call("count", item="apple")
    scripts = [
        [count, call("ship", item="apple", quantity=1) + count, "2"],
        [count, call("ship", item="apple", quantity=3) + count, "0"],
        [count, "3"],
        [count, call("ship", item="apple", quantity=2) + count, "5"],
    ]
    try:
        episodes = play_group(tokenizer, box, scripts, tmp_path, on_turn=lambda: seen.append(ledgers(tmp_path)))
        # reset's text is the first observation, after the row's prompt
        assert all(e.prompt_messages[-1] == {"role": "user", "content": "The fruit warehouse is open."} for e in episodes)
        # the same first call, the same result: each instance starts from the row
        assert all('"content": "3"' in e.observations[0] for e in episodes)
        # what a call leaves is seen by that episode's next call only
        left = [json.loads(e.observations[1].split("<tool_response>")[-1].split("</tool_response>")[0])["content"]
                for e in episodes if len(e.observations) > 1]
        assert left == ["2", "0", "1"]
        # reward() judges each episode's own state (1 when no apple is left) and its answer (+0.5 when right)
        assert [e.reward for e in episodes] == [0.5, 1.5, 0.5, 0.0]
        assert [e.success for e in episodes] == [False, True, False, False]
        # four instances, each in a process of its own (the ledger names its creator's pid), none in this one
        pids = {path.name.split("-")[1] for path in seen[0]}
        assert len(seen[0]) == 4 and len(pids) == 4 and str(os.getpid()) not in pids
        # each episode's close() ran when it ended: the third's before the others' last turn, theirs by the end
        assert [len(found) for found in seen] == [4, 4, 3] and ledgers(tmp_path) == []
        metrics = episode_metrics(episodes, counters=ToolEnv.counters, ratios=ToolEnv.ratios)
        assert metrics["tool/calls"] == total(3 + 3 + 1 + 3) and metrics["tool/errors"] == total(0)
        assert metrics["tool/lost_instances"].value == metrics["tool/reward_errors"].value == 0
    finally:
        box.close()
    assert descendants() <= before  # the host and the call process are gone with the toolbox


def test_a_method_that_raises_hangs_or_crashes_fails_its_own_episode_only(tokenizer, tmp_path):
    before = descendants()
    box = toolbox(tokenizer, [WAREHOUSE, "posttrain.tools:calculator"], timeout_s=1.5)
    scripts = [
        [call("ship", item="apple", quantity=9), call("count", item="apple"), "3"],
        [call("inspect_shelves", how="slowly"), "0"],
        [call("inspect_shelves", how="recklessly"), "0"],
        [call("ship", item="apple", quantity=3) + call("calculator", expression="6*7"), call("count", item="apple"), "0"],
    ]
    try:
        raised, hung, crashed, fine = play_group(tokenizer, box, scripts, tmp_path)
        assert "Error (exception): ValueError: only 3 apple in stock" in raised.observations[0]
        assert raised.counts["tool/errors/exception"] == 1 and '"content": "3"' in raised.observations[1]  # the episode went on
        assert raised.done and raised.reward == 0.5 and raised.counts["tool/lost_instances"] == 0
        # past its deadline or dead, the instance is lost with its state: its episode ends there, scored nothing
        assert hung.counts["tool/errors/timeout"] == 1 and hung.counts["tool/lost_instances"] == 1
        assert crashed.counts["tool/errors/crashed"] == 1 and crashed.counts["tool/lost_instances"] == 1
        assert hung.num_turns == crashed.num_turns == 1 and hung.done and crashed.done and hung.reward == crashed.reward == 0.0
        assert '"content": "42"' in fine.observations[0] and '"content": "0"' in fine.observations[1]
        assert fine.reward == 1.5 and fine.success and fine.counts["tool/errors"] == 0
        # the killed and the crashed instance never ran close(): their two ledgers stay; the others' are gone
        assert len(ledgers(tmp_path)) == 2
    finally:
        box.close()
    assert descendants() <= before


def test_a_host_that_dies_takes_its_episodes_processes_with_it(tmp_path):
    # the host is killed while an episode's call hangs: the controller stops the host's process group
    pool = InstancePool([ToolClass(WAREHOUSE.rpartition(":")[0], "Warehouse")], timeout_s=600)
    key, opened = pool.open({"stock": {"apple": 3}, "scratch_dir": str(tmp_path), "data_source": "fruit", "ground_truth": "0"})
    episode = psutil.Process(int(ledgers(tmp_path)[0].name.split("-")[1]))
    outcomes = []
    hanging = threading.Thread(target=lambda: outcomes.extend(pool.call([(key, 0, "inspect_shelves", {"how": "slowly"})])))
    hanging.start()
    time.sleep(1.0)
    os.kill(pool._process.pid, signal.SIGKILL)
    hanging.join(timeout=60)
    assert opened.ok and outcomes[0].died and not pool.alive(key)
    pool.close()
    assert gone(episode)  # the episode's process did not outlive its host


def gone(process: psutil.Process, wait_s: float = 10.0) -> bool:
    """Whether ``process`` ends within ``wait_s`` (a zombie that nobody reaps counts as ended)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_reset_that_fails_ends_its_episode_at_its_first_step(tokenizer, tmp_path):
    box = toolbox(tokenizer, [WAREHOUSE])
    try:
        calling, answering = play_group(tokenizer, box, [[call("count", item="apple"), "3"], ["3"]], tmp_path, truth="three")
    finally:
        box.close()
    for episode in (calling, answering):  # the error is its first observation; its first turn, a call or an answer, ends it
        assert "Error (exception): ValueError: invalid literal for int()" in episode.prompt_messages[-1]["content"]
        assert episode.num_turns == 1 and episode.done and episode.reward == 0.0 and episode.counts["tool/lost_instances"] == 1
    assert calling.counts["tool/errors/crashed"] == 1 and answering.counts["tool/reward_errors"] == 0


ECHO = textwrap.dedent('''
    class Echo:
        def reset(self, **row) -> str:
            return "; ".join(f"{key}={row[key]!r}" for key in sorted(row))

        def echo(self, text: str) -> str:
            """Say the text back.

            Args:
                text: What to say.
            """
            return text * 1000
''')


def test_reset_gets_the_rows_fields_and_without_reward_the_rows_score_function_scores(tokenizer, tmp_path):
    (tmp_path / "echo.py").write_text(ECHO)
    box = toolbox(tokenizer, [f"{tmp_path / 'echo.py'}:Echo"], max_chars=200)  # results are cut where they run
    try:
        env = ToolEnv(box)
        shown = env.reset(EpisodeSample([{"role": "user", "content": "2+2?"}], "4", "arithmetic", {"index": 3, "level": "easy"}))
        assert shown == ("data_source='arithmetic'; ground_truth='4'; index=3; level='easy'; "
                         "prompt=[{'role': 'user', 'content': '2+2?'}]")
        echoed = env.step(call("echo", text="ab"))
        assert echoed.observation.count("ab") == 100 and "(cut at 200 characters)" in echoed.observation
        answered = env.step("4")  # handed to the reward path, which scores it by arithmetic's score function
        assert answered.done and answered.reward == 0.0 and answered.answer == EpisodeAnswer("4")
        scored = RewardManager(tokenizer, timeout_s=None).score([Answer("4", "4", "arithmetic", {})])
        assert scored.scores.tolist() == [1.0]
        env.close()
    finally:
        box.close()


def test_posttrain_tools_prints_the_methods_schemas(capsys):
    assert main(["tools", WAREHOUSE, "--model", str(cached_tiny_model("llama"))]) == 0
    printed = capsys.readouterr().out
    schemas = json.loads(printed[: printed.index("\n# the prompt")])
    assert [s["function"]["name"] for s in schemas] == ["count", "ship", "inspect_shelves"]  # not reset, reward, close
    ship = schemas[1]["function"]
    assert ship["description"] == "Ship items out of the warehouse."
    assert ship["parameters"] == {"type": "object", "required": ["item"], "properties": {
        "item": {"type": "string", "description": "The item's name."},
        "quantity": {"type": "integer", "description": "How many to ship."}}}
    assert schemas[2]["function"]["parameters"]["properties"]["how"]["enum"] == ["slowly", "recklessly"]


def test_a_class_that_cannot_be_a_tool_class_is_refused(tmp_path):
    (tmp_path / "bad.py").write_text(textwrap.dedent('''
        class NeedsArguments:
            def __init__(self, size: int):
                self.size = size

            def grow(self) -> int:
                """Grow."""
                return self.size

        class NothingPublic:
            def _hidden(self) -> int:
                return 1
    '''))
    with pytest.raises(ToolSpecError, match=r"constructor needs \['size'\].*reset\(\*\*row\)"):
        load_tools([f"{tmp_path / 'bad.py'}:NeedsArguments"])
    with pytest.raises(ToolSpecError, match="no public methods"):
        load_tools([f"{tmp_path / 'bad.py'}:NothingPublic"])


MCP_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("adder")

    @server.tool(name="add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    if __name__ == "__main__":
        server.run("stdio")
''')


def test_functions_and_mcp_tools_run_beside_a_class(tokenizer, tmp_path):
    from posttrain.tools.mcp import McpServers

    (tmp_path / "server.py").write_text(MCP_SERVER)
    servers = McpServers([{"command": [sys.executable, str(tmp_path / "server.py")]}])
    tools = load_tools([WAREHOUSE, "posttrain.tools:calculator"]) + servers.tools()
    box = ToolBox(tools, tool_format=BuiltinFormat(tokenizer, [t.schema for t in tools], "hermes"), timeout_s=15.0, mcp=servers)
    try:
        env = ToolEnv(box)
        env.reset(EpisodeSample([{"role": "user", "content": "q"}], "0", "fruit", {"stock": {"apple": 3}, "scratch_dir": str(tmp_path)}))
        result = env.step(call("add", a=2, b=3) + call("ship", item="apple", quantity=3) + call("calculator", expression="6*7"))
        assert result.info.counts["tool/successes"] == 3 and not result.done
        shown = [result.observation.index(f'"content": "{text}"') for text in ("5", "shipped 3 apple", "42")]
        assert shown == sorted(shown)  # in the order called
        assert env.step("0").reward == 1.5  # no apple left, and the answer says so
        env.close()
    finally:
        box.close()
    assert ledgers(tmp_path) == []
