"""The OpenAI-compatible Env-LLM backend against a local stub server: replies, retries, refusals, timeouts, usage."""

import time

import pytest

from posttrain.agents.env_llm import EnvLLMError, OpenAIChatClient, ReplyCache, model_identity
from tests.chat_stub import Stub




@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.close()


def conversation(question):
    return [{"role": "system", "content": "You are a patient."}, {"role": "user", "content": question}]


def test_one_reply_per_conversation_in_order_with_usage(stub):
    client = OpenAIChatClient(stub.url, "patient-model", max_tokens=12, temperature=0.0)
    replies = client.chat([conversation(f"q{i}") for i in range(5)] + [conversation("a long one")])
    assert [r.text for r in replies] == [f"echo: q{i}" for i in range(5)] + ["echo: a long one"]
    assert [r.finish_reason for r in replies] == ["stop"] * 5 + ["length"]
    assert {r["path"] for r in stub.requests} == {"/v1/chat/completions"}
    body = stub.requests[0]["body"]
    assert body["model"] == "patient-model" and body["max_tokens"] == 12 and body["temperature"] == 0.0 and body["top_p"] == 1.0
    metrics = client.drain_metrics()
    assert metrics["env_llm/requests"].value == 1 and metrics["env_llm/replies"].value == 6
    assert metrics["env_llm/prompt_tokens"].value == 42 and metrics["env_llm/completion_tokens"].value == 18
    assert client.drain_metrics()["env_llm/replies"].value == 0  # drained
    client.close()


def test_server_errors_are_retried_then_succeed(stub):
    stub.failures = [503, 500]
    client = OpenAIChatClient(stub.url, "m", retries=2, backoff_s=0.01)
    assert client.chat([conversation("hello")])[0].text == "echo: hello"
    assert len(stub.requests) == 3 and client.drain_metrics()["env_llm/retries"].value == 2


def test_a_refused_request_is_not_retried_and_fails_only_its_own_conversation(stub):
    stub.failures = [400]
    client = OpenAIChatClient(stub.url, "m", retries=3, backoff_s=0.01, concurrency=1)
    first, second = client.chat([conversation("hello"), conversation("again")])
    assert first.failed and "HTTP 400" in first.error and "env.llm.api_model" in first.error
    assert second.text == "echo: again"
    assert len(stub.requests) == 2 and client.drain_metrics()["env_llm/failures"].value == 1


def test_rate_limits_are_retried(stub):
    stub.failures = [429]
    client = OpenAIChatClient(stub.url, "m", retries=1, backoff_s=0.01)
    assert client.chat([conversation("hello")])[0].text == "echo: hello"


def test_a_slow_server_times_out_after_the_retries(stub):
    stub.delay_s = 1.0
    client = OpenAIChatClient(stub.url, "m", timeout_s=0.2, retries=1, backoff_s=0.01)
    start = time.perf_counter()
    (reply,) = client.chat([conversation("hello")])
    assert reply.failed and "did not answer within env.llm.timeout_s=0.2s" in reply.error
    assert time.perf_counter() - start < 3 and len(stub.requests) == 2


def test_an_unreachable_server_fails_its_check_with_the_fix():
    client = OpenAIChatClient("http://127.0.0.1:9", "m", retries=0)
    with pytest.raises(EnvLLMError, match="cannot reach the chat server at http://127.0.0.1:9.*vllm serve"):
        client.check()


def test_a_run_refuses_a_dead_url_before_training(tmp_path):
    from posttrain.config.schema import EnvLLMConfig
    from posttrain.rollout.env_llm import open_env_llm

    with pytest.raises(EnvLLMError, match="unset env.llm.url to serve the model in the cluster"):
        open_env_llm(EnvLLMConfig(url="http://127.0.0.1:9/v1", retries=0), None)


# ---- the reply cache (env.llm.reply_cache) -------------------------------------------------------------


def cached_client(url, path, **sampling):
    client = OpenAIChatClient(url, "patient-model", backoff_s=0.01, retries=0)
    client.cache = ReplyCache(path, model_identity("patient-model", **({"temperature": 0.0} | sampling)))
    return client


def test_a_conversation_asked_before_is_replayed_from_the_cache_without_a_request(stub, tmp_path):
    path = tmp_path / "replies.sqlite"
    first = cached_client(stub.url, path)
    replies = first.chat([conversation("q1"), conversation("q2")])
    first.close()
    assert len(stub.requests) == 2
    # A new client (a later evaluation) on the same file, the conversations in another order, one new.
    stub.requests.clear()
    second = cached_client(stub.url, path)
    again = second.chat([conversation("q2"), conversation("q3"), conversation("q1")])
    assert [r.text for r in again] == ["echo: q2", "echo: q3", "echo: q1"]
    assert again[0] == replies[1] and again[2] == replies[0]
    assert [r["body"]["messages"][-1]["content"] for r in stub.requests] == ["q3"]  # only the new one was generated
    metrics = second.drain_metrics()
    assert metrics["env_llm/cached_replies"].value == 2 and metrics["env_llm/replies"].value == 3
    assert metrics["env_llm/completion_tokens"].value == 3  # what the model generated: the one new reply
    second.close()


def test_other_sampling_settings_or_a_retrained_model_do_not_replay(stub, tmp_path):
    path = tmp_path / "replies.sqlite"
    client = cached_client(stub.url, path)
    client.chat([conversation("q1")])
    hotter = cached_client(stub.url, path, temperature=0.7)
    hotter.chat([conversation("q1")])
    assert len(stub.requests) == 2
    model = tmp_path / "patient"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights one")
    before = model_identity(str(model))
    (model / "model.safetensors").write_bytes(b"weights, retrained")
    assert model_identity(str(model)) != before


def test_failed_replies_are_not_stored(stub, tmp_path):
    path = tmp_path / "replies.sqlite"
    stub.failures = [400]
    client = cached_client(stub.url, path)
    (failed,) = client.chat([conversation("q1")])
    assert failed.failed and len(client.cache) == 0
    (reply,) = client.chat([conversation("q1")])
    assert reply.text == "echo: q1" and len(client.cache) == 1


def test_a_file_that_is_not_a_cache_is_refused_by_its_key(tmp_path):
    path = tmp_path / "replies.sqlite"
    path.write_text("not a database")
    with pytest.raises(ValueError, match="env.llm.reply_cache=.*is not a reply cache"):
        ReplyCache(path, model_identity("m"))
