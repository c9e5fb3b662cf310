"""The retriever's token: only a loopback host serves without one, the service refuses requests without
it (401), the client and a run send it, a started service gets it by environment only, and a
config naming the token in place of its variable is refused."""

from __future__ import annotations

import re

import httpx
import pytest

from posttrain.agents.retriever import Hit, RetrieverClient, RetrieverError, RetrieverProcess, ServeError
from tests.agents.retriever_helpers import DOCUMENTS, FlakyIndex, serves_jazz


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("retriever.example.org", False),
])
def test_only_a_loopback_host_serves_without_a_token(host, allowed):
    from posttrain.agents.retriever.service import check_host

    check_host(host, "a-token")  # any host with a token
    if allowed:
        check_host(host, None)
    else:
        with pytest.raises(ServeError, match=f"--host {re.escape(host)} lets other machines reach"):
            check_host(host, None)


def test_serve_retriever_on_all_interfaces_without_a_token_refuses_before_loading(tmp_path, monkeypatch, capsys):
    from posttrain.cli import main

    monkeypatch.delenv("POSTTRAIN_RETRIEVER_TOKEN", raising=False)
    missing = tmp_path / "missing.jsonl"  # the refusal comes first, so the corpus is never opened
    assert main(["serve-retriever", "--corpus", str(missing), "--host", "0.0.0.0"]) == 2
    message = capsys.readouterr().err
    assert "--host 0.0.0.0 lets other machines reach the retriever, so it needs a token" in message
    assert "--token TOKEN" in message and "POSTTRAIN_RETRIEVER_TOKEN=TOKEN" in message
    assert "`Authorization: Bearer TOKEN`" in message and "env.retriever.token_env" in message
    assert "does not exist" not in message


def test_with_a_token_a_request_without_it_or_with_another_gets_401(threaded_service):
    start, _ = threaded_service
    index = FlakyIndex()
    url = start(index, token="s3cret")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}, {"authorization": "Bearer s3cret2"}):
        response = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers=headers, timeout=10)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer <token>" in response.json()["detail"]
    assert httpx.get(f"{url}/health").status_code == 401 and httpx.get(f"{url}/openapi.json").status_code == 401
    assert index.calls == 0  # none of them reached the index
    with_token = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"]}, headers={"authorization": "Bearer s3cret"}, timeout=10)
    assert with_token.status_code == 200 and index.calls == 1


def test_the_client_sends_its_token_and_names_the_fix_for_a_401(threaded_service):
    start, seen = threaded_service
    url = start(FlakyIndex(), token="s3cret")
    with RetrieverClient(url, token="s3cret") as client:
        assert client.health()["status"] == "ok" and client.retrieve(["q"], 1) == [[Hit(DOCUMENTS[0], 1.0)]]
    seen.clear()
    with RetrieverClient(url, retries=2, backoff_s=0.01) as client, pytest.raises(RetrieverError) as caught:
        client.retrieve(["q"], 1)
    assert "HTTP 401" in str(caught.value) and "env.retriever.token_env" in str(caught.value)
    assert seen == ["/retrieve"]  # a 401 is not retried


def test_a_run_sends_the_token_from_the_variable_token_env_names(threaded_service, monkeypatch):
    from posttrain.config.schema import RetrieverConfig
    from posttrain.rollout.retriever import open_retriever

    start, _ = threaded_service
    url = start(FlakyIndex(), token="s3cret")
    monkeypatch.delenv("MY_RETRIEVER_TOKEN", raising=False)
    config = RetrieverConfig(url=url, token_env="MY_RETRIEVER_TOKEN", retries=0)
    with pytest.raises(RetrieverError, match="HTTP 401"):
        open_retriever(config, None)
    monkeypatch.setenv("MY_RETRIEVER_TOKEN", "s3cret")
    handle = open_retriever(config, None)
    try:
        assert handle.client.retrieve(["q"], 1) == [[Hit(DOCUMENTS[0], 1.0)]]
    finally:
        handle.close()


def test_a_started_service_gets_its_token_by_environment_only(monkeypatch):
    from posttrain.agents.retriever.process import _child_env

    monkeypatch.setenv("POSTTRAIN_RETRIEVER_TOKEN", "someone-elses")
    assert "POSTTRAIN_RETRIEVER_TOKEN" not in _child_env(None)
    assert _child_env("s3cret")["POSTTRAIN_RETRIEVER_TOKEN"] == "s3cret"


def test_serve_retriever_on_all_interfaces_with_a_token_says_so_and_enforces_it(corpus_file, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_RETRIEVER_TOKEN", "not-this-one")  # the process hands the child its own
    with RetrieverProcess(corpus_file, "bm25", host="0.0.0.0", token="s3cret", startup_timeout_s=60) as service:
        assert "s3cret" not in " ".join(service.command)
        local = f"http://127.0.0.1:{service.port}"
        assert httpx.post(f"{local}/retrieve", json={"queries": ["jazz"]}, timeout=10).status_code == 401
        assert serves_jazz(local, {"authorization": "Bearer s3cret"})
        log = service.log_tail()
    assert "on http://0.0.0.0:" in log and "every request must carry `Authorization: Bearer <token>`" in log
    assert "s3cret" not in log


def test_a_token_in_place_of_its_variable_name_is_refused_without_printing_it():
    from posttrain.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config([], ["env.retriever.token_env=tok-3f9a.b7"])
    message = str(caught.value)
    assert "env.retriever.token_env" in message and "not the token itself" in message and "tok-3f9a.b7" not in message
    assert load_config([], ["env.retriever.token_env=MY_TOKEN_2"]).env.retriever.token_env == "MY_TOKEN_2"
    assert load_config([], ["env.retriever.token_env=null"]).env.retriever.token_env is None
