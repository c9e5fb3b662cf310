"""BFCL multi-turn through posttrain's episode (docs/tools.md "BFCL multi-turn"): the possible answer's calls,
written by a scripted model in the hermes format one user turn at a time (its calls, then a turn with no
call that brings the next user turn), run on the episode's own BFCL instances and judged by BFCL's own
multi-turn checker; an altered answer is refused; two episodes of one row never share state."""

from __future__ import annotations

import ast
import inspect
import json

import pytest
from tests.optional import require

require("bfcl_eval", 'bfcl-eval is installed by scripts/setup.sh (pip install --no-deps "bfcl-eval==2026.3.23")')

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, run_episodes  # noqa: E402
from posttrain.data.preparers.bfcl import load_multi_turn, multi_turn_row  # noqa: E402
from posttrain.models import tokenize_prompts  # noqa: E402
from posttrain.models.tool_format import row_schemas  # noqa: E402
from posttrain.rewards import bfcl_multi_turn  # noqa: E402
from posttrain.models.tool_formats.builtin import BuiltinFormat  # noqa: E402
from posttrain.tools import ToolBox, load_tools  # noqa: E402
from posttrain.tools.env import ToolEnv  # noqa: E402
from posttrain.tools.load import row_tool_class  # noqa: E402
from tests.tools.test_tool_classes import GroupEngine, call  # noqa: E402

WRAPPER = "posttrain.tools.bfcl_multi_turn:BfclMultiTurn"
ROWS = 24  # of multi_turn_base's 200
DONE = "Done."  # a turn with no call: the user turn is over


@pytest.fixture(scope="module")
def questions():
    return load_multi_turn("multi_turn_base", ROWS)


@pytest.fixture
def box(tokenizer):
    toolbox = ToolBox(load_tools([WRAPPER]), tool_format=BuiltinFormat(tokenizer, [], "hermes"), timeout_s=20.0, max_calls=64,
                      row_class=row_tool_class([WRAPPER]))
    yield toolbox
    toolbox.close()


def hermes(call_string: str, question: dict) -> str:
    """A ground-truth call string (``"mv(source='a', destination='b')"``, positional arguments included) as a
    hermes call, its positional arguments named by the BFCL method's signature."""
    node = ast.parse(call_string, mode="eval").body
    name = node.func.id
    instances = bfcl_multi_turn.load_instances(question["involved_classes"], question["initial_config"])
    method = getattr(instances[bfcl_multi_turn.method_owners(instances)[name]], name)
    names = list(inspect.signature(method).parameters)
    arguments = {names[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments |= {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def script(turns: list[list[str]], question: dict) -> list[str]:
    """The model's turns: each user turn's calls in one turn, then a turn with no call."""
    return [text for turn in turns for text in ([("\n".join(hermes(c, question) for c in turn))] if turn else []) + [DONE]]


def play(tokenizer, box, rows: list[dict], scripts: list[list[str]]):
    samples = [EpisodeSample(row["prompt"], row["reward_model"]["ground_truth"], row["data_source"], row["extra_info"]) for row in rows]
    prompts = [tokenize_prompts([s.prompt], tokenizer, row_schemas(s.extra_info["tools"]))[0] for s in samples]
    config = AgentLoopConfig(max_response_length=32_768, max_turns=max(len(s) for s in scripts) + 1, max_turn_tokens=1024, max_obs_length=4096)
    envs = [ToolEnv(box, answer="turns") for _ in rows]
    return run_episodes(envs, samples, prompts, GroupEngine(tokenizer, scripts), ObservationRenderer(tokenizer, "user"), config)


def test_bfcl_accepts_the_possible_answers_replayed_through_the_episode_and_refuses_altered_ones(tokenizer, box, questions):
    rows = [multi_turn_row(q, i) for i, q in enumerate(questions)]
    scripts = [script(q["ground_truth"], q) for q in questions]
    first = questions[0]  # multi_turn_base_0: cd, mkdir temp, mv final_report.pdf temp | ... 4 user turns
    wrong_value = [list(turn) for turn in first["ground_truth"]]
    wrong_value[0][1] = "mkdir(dir_name='tmp')"
    missing_call = [list(turn) for turn in first["ground_truth"]]
    missing_call[-1].pop()  # the last turn's diff
    episodes = play(tokenizer, box, [*rows, rows[0], rows[0]], [*scripts, script(wrong_value, first), script(missing_call, first)])
    accepted = [q["id"] for q, e in zip(questions, episodes) if e.reward == 1.0 and e.success]
    assert accepted == [q["id"] for q in questions]
    # every user turn was fed: the later ones came back as observations, in order
    for question, episode in zip(questions, episodes):
        assert episode.counts["user_turns"] == len(question["question"]) - 1 and episode.counts["answers"] == 1
        later = [turn[0]["content"] for turn in question["question"][1:]]
        assert [o for o in episode.observations if not o.startswith("<tool_response>")] == later
        assert episode.counts["tool/errors"] == 0
    assert [e.reward for e in episodes[ROWS:]] == [0.0, 0.0] and all(e.done for e in episodes[ROWS:])


def test_two_episodes_of_one_row_have_separate_state(tokenizer, box, questions):
    row = multi_turn_row(questions[0], 0)  # the GorillaFileSystem of multi_turn_base_0: workspace/document, workspace/archive
    ls = call("ls")
    episodes = play(tokenizer, box, [row, row], [[call("touch", file_name="made_here.txt") + "\n" + ls, ls, DONE], [ls, ls, DONE]])
    made, other = episodes
    assert "made_here.txt" in made.observations[0] and "made_here.txt" in made.observations[1]
    assert "made_here.txt" not in other.observations[0] + other.observations[1]
    assert json.loads(other.observations[0].split("<tool_response>")[1].split("</tool_response>")[0])["content"] == \
        json.loads(made.observations[0].split("<tool_response>")[-1].split("</tool_response>")[0])["content"].replace(', "made_here.txt"', "")
