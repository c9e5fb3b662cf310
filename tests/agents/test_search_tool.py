"""The search task in tool format: the built-in ``search`` tool against the real BM25 service, called
through the toolbox's child process, and the score of a plain-text final answer."""

from __future__ import annotations

import pytest

from posttrain.rewards.search_answer import compute_score
from posttrain.tools import ParsedCall, ToolBox, load_tools, search
from posttrain.tools.builtin import RETRIEVER_URL_VAR


def test_the_search_tool_returns_the_hits_the_search_agent_would_see(bm25_url, monkeypatch):
    monkeypatch.setenv(RETRIEVER_URL_VAR, bm25_url)
    shown = search("flightless bird")
    assert shown.startswith("<information>Doc 1 (Title: Penguin) The penguin is a flightless bird")
    box = ToolBox(load_tools(["posttrain.tools:search"]))  # its child process inherits the address
    try:
        (result,) = box.run([ParsedCall("search", '{"query": "lava crust"}')])
    finally:
        box.close()
    assert result.ok and "(Title: Volcano)" in result.text.splitlines()[0]


def test_without_a_retriever_the_call_is_an_error_the_model_reads(monkeypatch):
    monkeypatch.delenv(RETRIEVER_URL_VAR, raising=False)
    with pytest.raises(RuntimeError, match="no retriever"):
        search("anything")


@pytest.mark.parametrize(("reply", "right"), [
    ("Paris", 1.0), ("The Paris.", 1.0), ("I think <answer> paris </answer>", 1.0),
    ("It is Paris, or maybe Lyon", 0.0), ("Lyon", 0.0), ("", 0.0),
])
def test_a_plain_text_answer_scores_by_exact_match(reply, right):
    assert compute_score(reply, {"target": ["Paris", "City of Light"]}) == {"score": right, "acc": right}
