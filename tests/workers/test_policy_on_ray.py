"""The policy worker on a Ray CPU bundle, with the reference colocated, on a tiny model and vLLM:
generate → compute_log_prob → update → sync_weights, checked against what a person would check."""

import pytest
import torch

from posttrain import keys
from posttrain.config.schema import ActorConfig, DataConfig, ModelConfig, OptimConfig, RefConfig, RolloutConfig
from posttrain.controller import ResourcePool, WorkerSpec, spawn_ray
from posttrain.models import cached_tiny_model, load_tokenizer
from posttrain.protocol import Batch
from posttrain.rollout.batching import prompt_token_lists, responses_to_batch
from posttrain.workers.policy import VALIDATE_META_KEY, PolicyWorker
from posttrain.workers.reference import ReferenceWorker

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# fp32 on both sides: vLLM's behaviour logprobs and the trainer's must agree to this.
LOGPROB_TOLERANCE = 2e-3


def prompt_batch(tokenizer, questions: list[str]) -> Batch:
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True) for q in questions]
    rows = [r["input_ids"] if isinstance(r, dict) or hasattr(r, "keys") else r for r in rows]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return Batch.from_dict({keys.PROMPT_IDS: ids, keys.PROMPT_MASK: mask})


@pytest.fixture(scope="module")
def workers():
    from tests.conftest import start_local_ray

    start_local_ray()
    model_dir = str(cached_tiny_model("llama"))
    model = ModelConfig(path=model_dir)
    actor = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, dtype="float32", optim=OptimConfig(lr=1e-3))
    rollout = RolloutConfig(n=1, temperature=1.0, dtype="float32", cpu_kv_cache_gb=0.0625)  # the actor's dtype: logprobs agree
    data = DataConfig(max_prompt_length=64, max_response_length=16)
    pool = ResourcePool("policy", [1], cpus_per_bundle=1)
    groups = spawn_ray({
        "actor": WorkerSpec(PolicyWorker, (model, actor, rollout, data), {"seed": 3}),
        "ref": WorkerSpec(ReferenceWorker, (model, actor, RefConfig(), rollout)),
    }, pool, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    yield groups, model_dir
    pool.release()


def test_generate_logprobs_update_sync(workers, tmp_path):
    groups, model_dir = workers
    actor, ref = groups["actor"], groups["ref"]
    tokenizer = load_tokenizer(model_dir)
    prompts = prompt_batch(tokenizer, ["What is 2+3?", "Hello there", "Name a colour.", "Count to three."])

    sampled = actor.generate(prompts)
    assert [len(ids) for ids in sampled[keys.TURN_TOKEN_IDS]] == [len(lp) for lp in sampled[keys.TURN_LOGPROBS]]
    rollout = responses_to_batch(prompts, sampled, max_response_length=16, pad_token_id=tokenizer.pad_token_id)
    mask = rollout[keys.RESPONSE_MASK]
    assert rollout[keys.RESPONSE_IDS].shape == (4, 16) and mask.sum() > 0
    assert torch.equal(rollout[keys.INPUT_IDS][:, -16:], rollout[keys.RESPONSE_IDS])
    batch = prompts.union(rollout)

    old = actor.compute_log_prob(batch)
    behaviour = batch[keys.BEHAVIOUR_LOGPROBS]
    gap = ((old[keys.OLD_LOGPROBS] - behaviour).abs() * mask).max().item()
    assert gap < LOGPROB_TOLERANCE, f"vLLM and the training engine disagree by {gap}"
    reference = ref.compute_ref_log_prob(batch)
    assert torch.allclose(reference[keys.REF_LOGPROBS], old[keys.OLD_LOGPROBS], atol=1e-5)  # same weights so far

    # Push the first two responses up and the last two down.
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None] * mask
    batch = batch.union(old).union(reference).union(Batch.from_dict({keys.ADVANTAGES: advantages.float()}))
    metrics = actor.update(batch).metrics  # one list of typed metrics per name, a piece per rank
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr"):
        assert name in metrics and all(torch.isfinite(torch.tensor(m.value)) for m in metrics[name]), name
    assert [m.value for m in metrics["actor/lr"]] == [1e-3]

    after = actor.compute_log_prob(batch)[keys.OLD_LOGPROBS]
    # One small step up the surrogate: the advantage-weighted logprob change is positive.
    improvement = (advantages * (after - old[keys.OLD_LOGPROBS])).sum()
    assert improvement > 0

    assert actor.sync_weights(1) == [1]
    greedy = Batch.from_dict(prompts.tensors, meta={VALIDATE_META_KEY: True})
    synced = actor.generate(greedy)
    assert synced.meta[keys.WEIGHT_VERSION] == 1

    # the synced engine answers as the exported weights do, greedily (HF generate on the export: float32
    # greedy is vLLM's, tests/engines/test_vllm_engine.py; an in-process vLLM engine here would, once
    # collected, tear down the vLLM state that the engine tests' engines in this process share)
    export_dir = actor.export(str(tmp_path / "export"))[0]
    from posttrain.engines.rollout import GenerationParams, HFRolloutEngine

    fresh = HFRolloutEngine(export_dir, device="cpu", max_model_len=80)
    expected = fresh.generate(prompt_token_lists(prompts), GenerationParams(max_new_tokens=16, temperature=0.0))
    for row, generation in enumerate(expected):
        assert list(synced[keys.TURN_TOKEN_IDS][row]) == generation.response_token_ids


def test_tool_episodes_train_on_exactly_the_tokens_the_engine_sampled(workers):
    """A tool-calling episode with the real engine and a real tool: its tokens are the sampled turns
    with the rendered tool result between them, and the trainer's logprobs of the sampled tokens
    match the engine's. (The random tiny model writes no calls, so a parser reads each turn as one.)"""
    from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, TurnOutput, run_episodes
    from posttrain.tools.env import ToolEnv
    from posttrain.rollout.agent import episodes_to_batch
    from posttrain.models.tool_formats.template import TemplateFormat
    from posttrain.tools import ParsedCall, ParsedTurn, ToolBox, load_tools

    groups, model_dir = workers
    actor = groups["actor"]
    tokenizer = load_tokenizer(model_dir)
    prompts = prompt_batch(tokenizer, ["What is 6*7?", "And 5*5?"])
    samples = [EpisodeSample([{"role": "user", "content": q}], "42", "arithmetic") for q in ("What is 6*7?", "And 5*5?")]
    sampled: list[list[list[int]]] = [[], []]

    def generate(contexts, max_new_tokens, stop, request_keys):
        request = Batch.from_dict(non_tensors={keys.TURN_CONTEXT_IDS: [list(c) for c in contexts], keys.TURN_REQUEST_KEYS: list(request_keys)},
                                  meta={keys.TURN_MAX_NEW_TOKENS: max_new_tokens, keys.TURN_STOP: stop})
        reply = actor.generate_turn(request)
        for row, tokens in enumerate(reply[keys.TURN_TOKEN_IDS]):
            sampled[row].append(list(tokens))
        return [TurnOutput(list(t), list(lp), str(r)) for t, lp, r in
                zip(reply[keys.TURN_TOKEN_IDS], reply[keys.TURN_LOGPROBS], reply[keys.FINISH_REASON])]

    class EveryTurnCalls(TemplateFormat):  # results as the texts alone; each turn read as a call
        def parse(self, text, schemas=None):
            return ParsedTurn([ParsedCall("calculator", '{"expression": "6*7"}')], "")

    toolbox = ToolBox(load_tools(["posttrain.tools:calculator"]), tool_format=EveryTurnCalls(tokenizer))
    renderer = ObservationRenderer(tokenizer, "user")
    config = AgentLoopConfig(max_response_length=44, max_turns=1, max_turn_tokens=4, max_obs_length=32)
    try:
        episodes = run_episodes([ToolEnv(toolbox) for _ in samples], samples, prompt_token_lists(prompts), generate, renderer, config)
    finally:
        actor.release_rollout()
        toolbox.close()
    for row, episode in enumerate(episodes):
        first, final = sampled[row]
        shown = renderer.render("42", after_token=first[-1], budget=32, suffix=ToolEnv(toolbox).final_turn_instruction()).token_ids
        assert episode.response_ids == first + shown + final
        assert episode.loss_mask == [1] * len(first) + [0] * len(shown) + [1] * len(final)
    batch = episodes_to_batch(episodes, 44, tokenizer.pad_token_id)
    old = actor.compute_log_prob(batch)[keys.OLD_LOGPROBS]
    mask = batch[keys.RESPONSE_MASK]
    gap = ((old - batch[keys.BEHAVIOUR_LOGPROBS]).abs() * mask).max().item()
    assert mask.sum() == sum(len(t) for turns in sampled for t in turns)
    assert gap < LOGPROB_TOLERANCE, f"the engine's and the trainer's logprobs of the sampled tool-episode tokens differ by {gap}"
