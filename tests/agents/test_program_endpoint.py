"""The program endpoint (rollout/endpoint.py) with the real ``openai`` SDK against a tiny model on HF
generate: the ids the engine saw and sampled are what each episode records, a conversation that goes on
is one sample (the sampled ids never re-encoded), any other request a new one, tool calls come back in
OpenAI's shape and their results go in as the tool agent renders them, requests that arrive together
share one engine call, and bad requests get an OpenAI-shaped error."""

import asyncio
import json

import pytest
from tests.optional import require

require("openai", 'the openai SDK is installed by scripts/setup.sh (pip install -e ".[dev]")')

import openai  # noqa: E402

from posttrain.agents import TurnOutput  # noqa: E402
from posttrain.agents.render import ObservationRenderer, render_turns  # noqa: E402
from posttrain.engines.rollout.base import GenerationParams  # noqa: E402
from posttrain.engines.rollout.hf_engine import HFRolloutEngine  # noqa: E402
from posttrain.models import cached_tiny_model, load_tokenizer  # noqa: E402
from posttrain.models.tool_formats import make_tool_format  # noqa: E402
from posttrain.rollout.endpoint import EndpointSettings, ProgramEndpoint, episode_counts  # noqa: E402

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}


@pytest.fixture(scope="module")
def model():
    return cached_tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model):
    return load_tokenizer(model)


@pytest.fixture(scope="module")
def engine(model):
    return HFRolloutEngine(model, dtype="float32", device="cpu", max_model_len=512)


class Recorder:
    """The agent loop's engine call on the HF engine, greedy, remembering each call's contexts."""

    def __init__(self, engine, scripted=None):
        self.engine, self.scripted, self.calls = engine, scripted, []

    def __call__(self, contexts, max_new_tokens, stop, request_keys):
        self.calls.append([list(c) for c in contexts])
        if self.scripted is not None:  # fixed token ids per call, as a model might sample them
            ids = self.scripted.pop(0)
            return [TurnOutput(list(ids), [-0.5] * len(ids), "stop", 7) for _ in contexts]
        out = self.engine.generate(contexts, GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=stop))
        return [TurnOutput(g.response_token_ids, g.logprobs, g.finish_reason, g.weight_version) for g in out]


def endpoint_for(tokenizer, generate, **settings):
    options = {"model": "policy", "max_turn_tokens": 12, "max_response_length": 200} | settings
    return ProgramEndpoint(generate, tokenizer, make_tool_format("auto", tokenizer), EndpointSettings(**options))


def test_a_conversation_that_goes_on_is_one_sample_of_the_exact_ids(engine, tokenizer):
    generate = Recorder(engine)
    endpoint = endpoint_for(tokenizer, generate)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        messages = [{"role": "user", "content": "What is 2+3?"}]
        first = client.chat.completions.create(model="policy", messages=messages, logprobs=True)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "And 4+4?"}]
        second = client.chat.completions.create(model="policy", messages=messages, logprobs=True)
        episode = endpoint.close("e0")
    assert len(episode.samples) == 1 and episode.prefix_breaks == 0 and len(generate.calls) == 2
    sample = episode.samples[0]
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, return_dict=False)
    assert generate.calls[0] == [sample.prompt_ids] and sample.prompt_ids == list(prompt)
    # the second context: the first prompt, the sampled ids as they were, then only the new user turn
    turn_one = sample.response_ids[sample.turn_starts[0]: sample.turn_ends[0] + 1]
    rendered = ObservationRenderer(tokenizer, "user").render("And 4+4?", after_token=turn_one[-1], budget=100).token_ids
    assert generate.calls[1] == [prompt + turn_one + rendered]
    assert sample.loss_mask == [1] * len(turn_one) + [0] * len(rendered) + [1] * (len(sample.response_ids) - len(turn_one) - len(rendered))
    returned = [p.logprob for c in (first, second) for p in c.choices[0].logprobs.content]
    assert returned == pytest.approx([lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m])
    assert second.usage.prompt_tokens == len(generate.calls[1][0])
    assert episode_counts([episode]) == {"program/samples_per_episode": 1.0, "program/prefix_breaks": 0.0, "program/malformed_turns": 0.0}


def test_a_request_that_does_not_extend_the_last_starts_a_new_sample(engine, tokenizer):
    endpoint = endpoint_for(tokenizer, Recorder(engine))
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}])
        edited = {"role": "assistant", "content": first.choices[0].message.content + " (edited)"}
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}, edited, {"role": "user", "content": "Go on"}])
        episode = endpoint.close("e0")
    assert len(episode.samples) == 2 and episode.prefix_breaks == 1
    assert episode_counts([episode])["program/samples_per_episode"] == 2.0


def test_sampled_ids_that_re_encode_differently_stay_as_sampled(tokenizer):
    """The model wrote "Paris" as single characters: a re-encoding would merge them; the next context keeps them."""
    spelt = [tokenizer.convert_tokens_to_ids(ch) for ch in "Paris"] + [tokenizer.eos_token_id]
    assert tokenizer.encode("Paris", add_special_tokens=False) != spelt[:-1]
    generate = Recorder(None, scripted=[spelt, spelt])
    endpoint = endpoint_for(tokenizer, generate)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        messages = [{"role": "user", "content": "Capital of France?"}]
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        assert reply.content == "Paris"
        client.chat.completions.create(model="policy", messages=messages + [reply.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}])
        episode = endpoint.close("e0")
    prompt = episode.samples[0].prompt_ids
    assert generate.calls[1][0][len(prompt): len(prompt) + len(spelt)] == spelt and len(episode.samples) == 1


def test_a_reply_whose_only_call_cannot_be_read_comes_back_as_its_text_and_is_counted(tokenizer):
    """The built-in tool agent answers such a turn with an error; OpenAI's shape has no malformed call, so
    the program gets the text as the content (its answer, unless it looks) and the turn is counted."""
    broken = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>', add_special_tokens=False)
    generate = Recorder(None, scripted=[broken + [tokenizer.eos_token_id]])
    endpoint = endpoint_for(tokenizer, generate, max_turn_tokens=64)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[ADD])
        episode = endpoint.close("e0")
    assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.content.startswith("<tool_call>")
    assert episode_counts([episode])["program/malformed_turns"] == 1.0


def test_a_reply_with_a_call_read_and_one_not_returns_the_read_one_and_is_counted(tokenizer):
    # a call marker inside an argument: one call begun more than the parser reads (tests/tools/test_env.py)
    ids = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 2, "b": "3 <tool_call>"}}</tool_call>', add_special_tokens=False)
    endpoint = endpoint_for(tokenizer, Recorder(None, scripted=[ids + [tokenizer.eos_token_id]]), max_turn_tokens=64)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[ADD])
        episode = endpoint.close("e0")
    assert len(reply.choices[0].message.tool_calls) == 1 and episode_counts([episode])["program/malformed_turns"] == 1.0


def test_tool_calls_come_back_in_openai_shape_and_results_go_in_as_the_tool_agent_renders_them(tokenizer):
    call = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', add_special_tokens=False)
    answer = tokenizer.encode("It is 5.", add_special_tokens=False)
    generate = Recorder(None, scripted=[call + [tokenizer.eos_token_id], answer + [tokenizer.eos_token_id]])
    endpoint = endpoint_for(tokenizer, generate, max_turn_tokens=64)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        messages = [{"role": "user", "content": "Add 2 and 3."}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
        assert message.tool_calls[0].function.name == "add" and json.loads(message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
        messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"}]
        second = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "It is 5."
        episode = endpoint.close("e0")
    tool_format = make_tool_format("auto", tokenizer)
    observation = render_turns(tokenizer, [(tool_format.observation_role, tool_format.observation([("add", "5")]))],
                               after_token=tokenizer.eos_token_id)
    assert observation == ObservationRenderer(tokenizer, tool_format.observation_role).render(
        tool_format.observation([("add", "5")]), after_token=tokenizer.eos_token_id, budget=200).token_ids
    sample = episode.samples[0]
    assert len(episode.samples) == 1 and generate.calls[1] == [sample.prompt_ids + call + [tokenizer.eos_token_id] + observation]


def test_requests_that_arrive_together_share_one_engine_call(engine, tokenizer):
    generate = Recorder(engine)
    endpoint = endpoint_for(tokenizer, generate, gather_s=0.5)
    with endpoint.serving():
        urls = [endpoint.open(f"e{i}") for i in range(3)]

        async def program(url, question):
            client = openai.AsyncOpenAI(base_url=url, api_key="-")
            return await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}])

        async def together():
            return await asyncio.gather(*(program(url, f"Question {i}?") for i, url in enumerate(urls)))

        replies = asyncio.run(together())
        episodes = [endpoint.close(f"e{i}") for i in range(3)]
    assert len(generate.calls) == 1 and len(generate.calls[0]) == 3 and len(replies) == 3
    assert sorted(e.samples[0].prompt_ids for e in episodes) == sorted(generate.calls[0])  # in the order they arrived


def test_bad_requests_get_openai_errors_and_other_sampling_is_counted_or_refused(engine, tokenizer):
    endpoint = endpoint_for(tokenizer, Recorder(engine))
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-", max_retries=0)
        hello = [{"role": "user", "content": "Hi"}]
        with pytest.raises(openai.BadRequestError, match="n=1"):
            client.chat.completions.create(model="policy", messages=hello, n=2)
        client.chat.completions.create(model="other", messages=hello, temperature=1.3)
        assert endpoint.counts["program/sampling_ignored"] == 1
        endpoint.close("e0")
        with pytest.raises(openai.NotFoundError, match="not open"):
            client.chat.completions.create(model="policy", messages=hello)
        assert [m.id for m in client.models.list()] == ["policy"]
        for index, (bad, message) in enumerate((({"stream": True}, "stream=true"), ({"tool_choice": "required"}, "tool_choice"),
                                                ({"stop": [["x"]]}, "list of strings"))):
            with pytest.raises(openai.BadRequestError, match=message):
                openai.OpenAI(base_url=endpoint.open(f"bad{index}"), api_key="-", max_retries=0).chat.completions.create(
                    model="policy", messages=hello, extra_body=bad)
    strict = endpoint_for(tokenizer, Recorder(engine), refuse_other_sampling=True, max_response_length=8)
    with strict.serving():
        client = openai.OpenAI(base_url=strict.open("e0"), api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="temperature"):
            client.chat.completions.create(model="policy", messages=hello, temperature=1.3)
        first = client.chat.completions.create(model="policy", messages=hello, max_tokens=7).choices[0].message
        with pytest.raises(openai.BadRequestError, match="max_response_length=8"):
            client.chat.completions.create(model="policy", messages=hello + [first.model_dump(exclude_none=True), {"role": "user", "content": "more"}])


def test_an_engine_failure_is_a_500_for_that_request_and_leaves_the_episode_as_it_was(tokenizer):
    calls = []

    def generate(contexts, max_new_tokens, stop, request_keys):
        calls.append([list(c) for c in contexts])
        if len(calls) == 2:
            raise RuntimeError("engine fell over")
        return [TurnOutput([tokenizer.eos_token_id], [-0.1], "stop", 0) for _ in contexts]

    endpoint = endpoint_for(tokenizer, generate)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-", max_retries=0)
        messages = [{"role": "user", "content": "Hi"}]
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        with pytest.raises(openai.InternalServerError, match="engine fell over"):
            client.chat.completions.create(model="policy", messages=messages)
        assert client.chat.completions.create(model="policy", messages=messages).choices[0].finish_reason == "stop"
        episode = endpoint.close("e0")
    assert endpoint.counts["program/engine_errors"] == 1
    assert calls[2] == calls[1] and len(episode.samples) == 1 and episode.requests == 2  # the retry saw what the failed one did
    assert episode.samples[0].context == calls[2][0] + [tokenizer.eos_token_id]


def test_two_requests_of_one_episode_at_once_the_second_is_refused(tokenizer):
    import time as clock

    def slow(contexts, max_new_tokens, stop, request_keys):
        clock.sleep(0.5)
        return [TurnOutput([tokenizer.eos_token_id], [-0.1], "stop", 0) for _ in contexts]

    endpoint = endpoint_for(tokenizer, slow)
    with endpoint.serving():
        url = endpoint.open("e0")

        async def both():
            client = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0)
            ask = lambda: client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}])  # noqa: E731
            return await asyncio.gather(ask(), ask(), return_exceptions=True)

        answers = asyncio.run(both())
        episode = endpoint.close("e0")
    assert sorted(type(a).__name__ for a in answers) == ["ChatCompletion", "ConflictError"] and episode.requests == 1


def test_results_of_several_calls_go_in_call_order_and_other_tools_start_a_new_sample(tokenizer):
    two = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
                           '<tool_call>{"name": "mul", "arguments": {"a": 3, "b": 4}}</tool_call>', add_special_tokens=False)
    done = tokenizer.encode("3 and 12.", add_special_tokens=False) + [tokenizer.eos_token_id]
    generate = Recorder(None, scripted=[two + [tokenizer.eos_token_id], done, done])
    mul = {"type": "function", "function": {**ADD["function"], "name": "mul", "description": "Multiply."}}
    endpoint = endpoint_for(tokenizer, generate, max_turn_tokens=64)
    with endpoint.serving():
        client = openai.OpenAI(base_url=endpoint.open("e0"), api_key="-")
        messages = [{"role": "user", "content": "1+2 and 3*4?"}]
        message = client.chat.completions.create(model="policy", messages=messages, tools=[ADD, mul]).choices[0].message
        first, second = message.tool_calls
        messages += [message.model_dump(exclude_none=True),  # the results out of order, then a user turn
                     {"role": "tool", "tool_call_id": second.id, "content": "12"}, {"role": "tool", "tool_call_id": first.id, "content": "3"},
                     {"role": "user", "content": "Say both."}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[ADD, mul]).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "again"}]  # it would extend, but for the tools
        client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        episode = endpoint.close("e0")
    tool_format = make_tool_format("auto", tokenizer)
    # the user message right after the results joins them on its own line, as the built-in final-turn instruction
    assert tool_format.observation_role == "user"
    expected = render_turns(tokenizer, [("user", (tool_format.observation([("add", "3"), ("mul", "12")]), "\nSay both."))],
                            after_token=tokenizer.eos_token_id)
    sample = episode.samples[0]
    assert generate.calls[1] == [sample.prompt_ids + two + [tokenizer.eos_token_id] + expected]
    assert len(episode.samples) == 2 and episode.prefix_breaks == 1  # the third request told other tools
