"""``env.name: program`` as a rollout (rollout/program.py), in process on a tiny model: a user's plain
``openai`` program and the built-in tool environment, greedy on the same rows, give the same token ids,
loss masks, logprobs and rewards; an episode that breaks its prefix gives two samples that count once
in their group; a program that fails before asking still has its row, scored 0."""

import json
from pathlib import Path

import pytest
import torch
from tests.optional import require

require("openai", 'the openai SDK is installed by scripts/setup.sh (pip install -e ".[dev]")')

from posttrain import keys  # noqa: E402
from posttrain.config import load_config  # noqa: E402
from posttrain.config.loader import preset_path  # noqa: E402
from posttrain.engines.rollout.base import GenerationParams  # noqa: E402
from posttrain.engines.rollout.hf_engine import HFRolloutEngine  # noqa: E402
from posttrain.metrics import values  # noqa: E402
from posttrain.protocol import Batch  # noqa: E402
from posttrain.rollout import RolloutRoles  # noqa: E402
from posttrain.rollout.batching import group_ids_of  # noqa: E402
from posttrain.rollout.toolbox import tool_schemas  # noqa: E402
from posttrain.trainer.learn import advantage_estimator, compute_advantages  # noqa: E402
from posttrain.trainer.setup import rollout_setup  # noqa: E402
from posttrain.workers.sampling import Sampling  # noqa: E402
from tests.e2e.test_tool_agent import tool_calling_model, user_tools  # noqa: E402

# the user's agent, as they would write it against any OpenAI-compatible server: its own loop, its own
# copy of the tool, the tools' schemas as JSON (here the run's own, so the prompts can be compared)
PROGRAM = '''
import json

TOOLS = SCHEMAS


def multiply(a, b, rounding="exact"):
    product = a * b
    return str(round(product, -3) if rounding == "thousands" else product)


async def rollout(client, row):
    messages = list(row["messages"])
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None  # the row's score function judges the last reply
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": multiply(**json.loads(call.function.arguments))})
'''

SHARED = ["data.builtin_options.train_size=16", "data.builtin_options.val_size=4", "data.builtin_options.longer_size=2",
          "data.builtin_options.sft_size=0", "data.builtin_options.sft_val_size=0", "env.max_turns=4",
          "env.max_turn_tokens=40", "data.max_response_length=256", "actor_rollout_ref.rollout.n=2"]


class GreedySampler:
    """The policy's ``generate_turn`` on a local HF engine, greedy, one context at a time (so a context's
    reply does not depend on what else is in the call), counting the contexts it was asked."""

    def __init__(self, engine):
        self.engine, self.contexts = engine, 0

    def generate_turn(self, batch):
        contexts = batch[keys.TURN_CONTEXT_IDS]
        self.contexts += len(contexts)
        params = GenerationParams(max_new_tokens=batch.meta[keys.TURN_MAX_NEW_TOKENS], temperature=0.0, stop=tuple(batch.meta[keys.TURN_STOP]))
        out = [self.engine.generate([list(context)], params)[0] for context in contexts]
        return Batch.from_dict(non_tensors={keys.TURN_TOKEN_IDS: [g.response_token_ids for g in out],
                                            keys.TURN_LOGPROBS: [g.logprobs for g in out],
                                            keys.FINISH_REASON: [g.finish_reason for g in out]}, meta={keys.WEIGHT_VERSION: 0})

    def release_rollout(self):
        return None


@pytest.fixture(scope="module")
def model():
    return tool_calling_model()


@pytest.fixture(scope="module")
def engine(model):
    return HFRolloutEngine(str(model), dtype="float32", device="cpu", max_model_len=1024)


def configs(tmp_path, model, program_text=None):
    tools = tmp_path / "my_tools.py"
    tools.write_text(user_tools(tmp_path / "calls.jsonl"))
    base = [f"actor_rollout_ref.model.path={model}", *SHARED]
    from posttrain.config.loader import preset_path

    preset = [preset_path("tool_grpo")]
    builtin = load_config(preset, [*base, f"env.tools=[{tools}:multiply]"])
    program = tmp_path / "agent.py"
    program.write_text(program_text or PROGRAM.replace("SCHEMAS", json.dumps(tool_schemas(builtin.env))))
    return builtin, load_config(preset, [*base, "env.name=program", f"env.options={{entry: {program}:rollout}}", "env.tools=[]"])


def rollout_of(config, sampler, *, validate=False):
    setup = rollout_setup(config, training=False)
    prompts = next(iter(setup.data.val))
    batch = prompts.repeat(config.actor_rollout_ref.rollout.n, interleave=True)
    batch.tensors[keys.GROUP_IDS] = group_ids_of(batch[keys.UID])
    setup.rollout.open(RolloutRoles(actor=sampler))
    try:
        scored, metrics = setup.rollout(RolloutRoles(actor=sampler), batch, validate=validate, whole_batch=False)
        return scored, values(metrics)
    finally:
        setup.rollout.close()


def test_a_program_and_the_builtin_tool_environment_give_the_same_ids_masks_and_rewards(tmp_path, model, engine):
    builtin, program = configs(tmp_path, model)
    built, built_metrics = rollout_of(builtin, GreedySampler(engine))
    sampler = GreedySampler(engine)
    ran, ran_metrics = rollout_of(program, sampler)
    assert ran_metrics["program/errors"] == 0 and ran_metrics["program/prefix_breaks"] == 0
    # the scenario compared: every episode called the tool, then answered (no forced final turn)
    assert built_metrics["env/answers"] == 8 and built_metrics["tool/successes"] >= 8 and built_metrics["agent/forced_final_ratio"] == 0
    assert len(ran) == len(built) == 8 and sampler.contexts == ran_metrics["program/requests"]
    width = lambda batch, key: batch[key][:, -built[keys.PROMPT_IDS].shape[1]:] if key == keys.PROMPT_IDS else batch[key]  # noqa: E731
    for key in (keys.PROMPT_IDS, keys.RESPONSE_IDS, keys.RESPONSE_MASK, keys.TOKEN_SCORES, keys.BEHAVIOUR_LOGPROBS):
        assert torch.equal(width(ran, key), width(built, key)), key
    assert ran["reward_extra/acc"].tolist() == built["reward_extra/acc"].tolist()
    assert ran_metrics["agent/success_rate"] == built_metrics["agent/success_rate"] == ran["reward_extra/acc"].mean()
    assert (built[keys.RESPONSE_MASK] == 0).any(), "an observation (the tool's result) is in every episode, not trained"


LAST_TURN = '''
import json

TOOLS = SCHEMAS


async def rollout(client, row):
    """One tool turn, then the built-in agent's final-turn instruction as a user message after the results."""
    messages = list(row["messages"])
    for turn in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if turn == 1 or not message.tool_calls:
            return None
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] * arguments["b"])})
        messages.append({"role": "user", "content": "INSTRUCTION"})
'''


def test_a_user_message_after_tool_results_is_rendered_as_the_builtin_final_turn_instruction(tmp_path, model, engine):
    """env.max_turns=1: the built-in agent appends its final-turn instruction to the first results; a program
    that sends it as a user message after them gets the same tokens."""
    builtin, _ = configs(tmp_path, model)
    instruction = "You have no tool calls left. Give your final answer now, without calling a tool."
    text = LAST_TURN.replace("SCHEMAS", json.dumps(tool_schemas(builtin.env))).replace("INSTRUCTION", instruction)
    builtin, program = configs(tmp_path, model, text)
    builtin.env.max_turns = program.env.max_turns = 1
    built, built_metrics = rollout_of(builtin, GreedySampler(engine))
    ran, ran_metrics = rollout_of(program, GreedySampler(engine))
    assert built_metrics["agent/forced_final_ratio"] == 1 and ran_metrics["program/prefix_breaks"] == 0
    for key in (keys.PROMPT_IDS, keys.RESPONSE_IDS, keys.RESPONSE_MASK):
        assert torch.equal(ran[key][:, -built[key].shape[1]:], built[key]), key
    assert instruction in GreedySampler(engine).engine._tokenizer.decode(built[keys.RESPONSE_IDS][0])


class LocalSampling(Sampling):
    """The policy worker's own ``generate_turn`` (workers/sampling.py: each request seeded by its key) on a
    local engine, with the run's sampling settings."""

    rank = 0

    def __init__(self, engine, config):
        self.rollout, self.rollout_config, self.data, self.seed = engine, config.actor_rollout_ref.rollout, config.data, config.trainer.seed
        self.calls: list[int] = []

    def generate_turn(self, batch):
        self.calls.append(len(batch))
        return super().generate_turn(batch)


def test_sampled_a_program_and_the_builtin_tool_environment_still_give_the_same_ids(tmp_path, model, engine):
    """At temperature 1 the two paths gather their requests into different engine calls; each request is
    seeded by its episode's key and turn, so the paths sample the same tokens."""
    builtin, program = configs(tmp_path, model)
    sampler = LocalSampling(engine, builtin)
    built, built_metrics = rollout_of(builtin, sampler)
    ran, ran_metrics = rollout_of(program, LocalSampling(engine, program))
    assert builtin.actor_rollout_ref.rollout.temperature == 1.0 and ran_metrics["program/errors"] == 0
    assert len(ran) == len(built) == 8
    for key in (keys.RESPONSE_IDS, keys.RESPONSE_MASK, keys.TOKEN_SCORES, keys.BEHAVIOUR_LOGPROBS):
        assert torch.equal(ran[key], built[key]), key
    first = built[keys.RESPONSE_IDS][0::2]  # the two samples of each row differ: a group is not one sample twice
    assert not torch.equal(first, built[keys.RESPONSE_IDS][1::2])


BREAKS = '''
import os


async def rollout(client, row):
    """Row 1 fails before asking anything. Of the other rows' two episodes, the first to claim the row asks
    twice, its history trimmed the second time (a prefix break: two samples), and scores 1; the other asks
    once and scores 0."""
    index = row["extra_info"]["index"]
    if index == 1:
        raise RuntimeError("this program fails at once")
    try:
        os.close(os.open(os.path.join(CLAIMS, str(index)), os.O_CREAT | os.O_EXCL))
        first = True
    except FileExistsError:
        first = False
    await client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=6)
    if first:
        await client.chat.completions.create(model="policy", messages=row["messages"] + [{"role": "user", "content": "Again."}], max_tokens=6)
    return {"score": float(first), "acc": first}
'''


def breaks(tmp_path):
    (tmp_path / "claims").mkdir()
    return BREAKS.replace("CLAIMS", repr(str(tmp_path / "claims")))


def test_prefix_breaks_add_samples_that_count_once_in_their_group_and_a_failed_program_keeps_its_row(tmp_path, model, engine):
    _, program = configs(tmp_path, model, breaks(tmp_path))
    batch, metrics = rollout_of(program, GreedySampler(engine))
    episodes, index = list(batch[keys.EPISODE_IDS]), [info["index"] for info in batch[keys.EXTRA_INFO]]
    # 4 rows × n=2 episodes: 3 rows' episodes gave 2 + 1 samples, row 1's two failed at once (a row each)
    assert len(batch) == 3 * 3 + 2 and len(set(episodes)) == 8
    assert metrics["program/errors"] == 2 and metrics["program/no_request"] == 2 and metrics["program/prefix_breaks"] == pytest.approx(3 / 8)
    assert metrics["agent/success_rate"] == pytest.approx(3 / 8)  # over episodes (3 of 8 scored 1), not over the 11 samples
    failed = [i for i, row in enumerate(index) if row == 1]
    assert len(failed) == 2 and all(batch[keys.RESPONSE_MASK][i].sum() == 0 and batch[keys.TOKEN_SCORES][i].sum() == 0 for i in failed)
    scored = compute_advantages(batch, advantage_estimator(program))
    trained = scored[keys.RESPONSE_MASK].sum(-1)
    advantage = (scored[keys.ADVANTAGES].sum(-1) / trained.clamp_min(1)).tolist()
    for row in (0, 2, 3):
        members = [i for i, r in enumerate(index) if r == row]
        twice = [i for i in members if episodes.count(episodes[i]) == 2]
        once = [i for i in members if episodes.count(episodes[i]) == 1]
        assert len(twice) == 2 and len(once) == 1
        assert all(batch[keys.TOKEN_SCORES][i].sum() == 1.0 for i in twice) and batch[keys.TOKEN_SCORES][once[0]].sum() == 0.0
        # GRPO over the group's two episodes (scores 1 and 0): ±1/std = ±0.7071 on every trained token;
        # counted per sample (1, 1, 0) it would be +0.577 and -1.155
        assert [round(advantage[i], 3) for i in twice] == [0.707, 0.707] and round(advantage[once[0]], 3) == -0.707
    assert all(advantage[i] == 0.0 for i in failed)


def test_validation_gives_one_row_per_episode_its_last_sample(tmp_path, model, engine):
    _, program = configs(tmp_path, model, breaks(tmp_path))
    batch, _ = rollout_of(program, GreedySampler(engine), validate=True)
    assert len(batch) == 8 and len(set(batch[keys.EPISODE_IDS])) == 8
    transcripts = [t for t, info in zip(batch[keys.TRANSCRIPT], batch[keys.EXTRA_INFO]) if info["index"] != 1]
    assert sorted(t[-2]["content"] == "Again." for t in transcripts) == [False] * 3 + [True] * 3  # the last sample's request


ENDS_EARLY = '''
async def rollout(client, row):
    """Row 0's episodes end at once; the others ask twice."""
    if row["extra_info"]["index"] == 0:
        return 0.5
    messages = row["messages"]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages = messages + [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
    return 1.0
'''


class CountingSampler(GreedySampler):
    def __init__(self, engine):
        super().__init__(engine)
        self.calls = []

    def generate_turn(self, batch):
        self.calls.append(len(batch[keys.TURN_CONTEXT_IDS]))
        return super().generate_turn(batch)


def test_requests_are_gathered_into_one_engine_call_without_waiting_for_episodes_that_ended(tmp_path, model, engine):
    """An episode is closed as its program ends, so the others' requests go to the engine as soon as each
    open episode has one waiting: with a minute's gather_s and a 30 s deadline, waiting for the two episodes
    that ended would time every other one out."""
    _, program = configs(tmp_path, model, ENDS_EARLY)
    program.env.options = {**program.env.options, "gather_s": 60.0, "deadline_s": 30.0}
    sampler = CountingSampler(engine)
    batch, metrics = rollout_of(program, sampler)
    assert metrics["program/errors"] == 0 and metrics["program/timeouts"] == 0 and metrics["program/requests"] == 12
    assert sampler.calls == [6, 6]  # the 6 episodes of rows 1-3, twice
    # row 0's episodes asked nothing: no token is trained, and their 0.5 still counts in their group
    assert sorted(batch[keys.TOKEN_SCORES].sum(-1).tolist()) == [0.5, 0.5] + [1.0] * 6
    assert batch[keys.RESPONSE_MASK][[i for i, info in enumerate(batch[keys.EXTRA_INFO]) if info["index"] == 0]].sum() == 0


SEARCHES = '''
import importlib.util
import httpx

spec = importlib.util.spec_from_file_location("search_agent", EXAMPLE)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


async def rollout(client, row):
    """The search example's own tool against the run's retriever, for the row's question; then one request."""
    async with httpx.AsyncClient(timeout=30) as http:
        passages = await example.search(http, row["messages"][-1]["content"])
    await client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=2)
    return {"score": float(passages.startswith("<information>Doc 1 (Title: ")), "acc": "No documents" not in passages}
'''


def test_with_retriever_the_run_starts_one_and_the_search_examples_tool_finds_passages_in_it(tmp_path, engine):
    program = tmp_path / "searches.py"
    example = Path(__file__).resolve().parents[2] / "examples" / "search_agent.py"
    program.write_text(SEARCHES.replace("EXAMPLE", repr(str(example))))
    config = load_config([preset_path("search_tools")], [
        f"actor_rollout_ref.model.path={tool_calling_model()}", "data.builtin_options.train_size=8", "data.builtin_options.val_size=4",
        "actor_rollout_ref.rollout.n=2", "env.name=program", "env.tools=[]", f"env.options={{entry: {program}:rollout, use_retriever: true}}"])
    batch, metrics = rollout_of(config, GreedySampler(engine))
    assert metrics["program/errors"] == 0 and len(batch) == 8
    assert batch[keys.TOKEN_SCORES].sum(-1).tolist() == [1.0] * 8 and batch["reward_extra/acc"].tolist() == [1.0] * 8


COMMAND = '''
import json, sys
from openai import OpenAI

row = json.load(sys.stdin)
reply = OpenAI().chat.completions.create(model="policy", messages=row["messages"], max_tokens=4)  # OPENAI_BASE_URL: the episode's
print("anything the agent prints first")
print(json.dumps({"score": 0.25 * (1 + row["extra_info"]["index"] % 2), "acc": bool(reply.choices[0].message.content is not None)}))
'''


def test_a_program_given_as_a_command_gets_the_row_on_stdin_and_its_last_printed_line_is_its_score(tmp_path, model, engine):
    import sys

    command = tmp_path / "agent_cli.py"
    command.write_text(COMMAND)
    _, program = configs(tmp_path, model)
    program.env.options = {"command": f"{sys.executable} {command}"}
    batch, metrics = rollout_of(program, GreedySampler(engine), validate=True)
    assert metrics["program/errors"] == 0 and metrics["program/requests"] == 8
    expected = [0.25 * (1 + info["index"] % 2) for info in batch[keys.EXTRA_INFO]]
    assert batch[keys.TOKEN_SCORES].sum(-1).tolist() == expected and batch["reward_extra/acc"].tolist() == [1.0] * 8
