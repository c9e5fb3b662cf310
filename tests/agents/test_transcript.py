"""Transcripts for SFT are laid out exactly as the agent loop lays out the same episode."""

from __future__ import annotations

import pytest

from posttrain.agents import AgentLoopConfig, EpisodeSample, ObservationRenderer, TurnOutput, run_episodes
from posttrain.agents.retriever.index import BM25Index
from posttrain.agents.retriever.types import Document
from posttrain.agents.search import SearchEnv
from posttrain.agents.transcript import TranscriptError, TranscriptTokenizer
from posttrain.models import tokenize_prompts

CORPUS = [
    Document("0", '"Velnor Kastrin"\nVelnor Kastrin is a painter born in 1901 in Dunmaro. Velnor Kastrin works for Haltor Guild.'),
    Document("1", '"Dunmaro"\nDunmaro is a city in Belmoria, founded in 1420. The Sabri River runs through Dunmaro.'),
    Document("2", '"Haltor Guild"\nHaltor Guild is a mining organisation founded in 1930 by Velnor Kastrin. Its headquarters are in Dunmaro.'),
]


class IndexRetriever:
    def __init__(self) -> None:
        self.index = BM25Index(CORPUS)

    def retrieve(self, queries, topk):
        return self.index.search(queries, topk)


def _play(tokenizer, actions: list[str], eos_after: bool = False):
    """One SearchEnv episode in the real agent loop, the engine 'sampling' ``actions`` token by token."""
    sample = EpisodeSample([{"role": "user", "content": "In which country was Velnor Kastrin born?"}], {"target": ["Belmoria"]})
    prompt = tokenize_prompts([sample.prompt], tokenizer)[0]
    turns = iter(actions)

    def generate(contexts, max_new_tokens, stop, request_keys):
        tokens = tokenizer.encode(next(turns), add_special_tokens=False) + ([tokenizer.eos_token_id] if eos_after else [])
        return [TurnOutput(tokens, [-0.1] * len(tokens), "stop")]

    env = SearchEnv(IndexRetriever(), topk=2)
    config = AgentLoopConfig(max_response_length=1024, max_turns=3, max_turn_tokens=64, max_obs_length=512)
    (episode,) = run_episodes([env], [sample], [prompt], generate, ObservationRenderer(tokenizer), config)
    return episode, env


def test_a_search_transcript_has_the_agent_loops_tokens_and_loss_mask(tokenizer):
    actions = ["<search> Velnor Kastrin </search>", "<search> Dunmaro </search>", "<answer> Belmoria </answer>"]
    episode, env = _play(tokenizer, actions)
    assert episode.success and episode.num_turns == 3
    transcript = TranscriptTokenizer(tokenizer, env.stop_strings)(episode.messages())
    assert transcript.prompt_ids == episode.prompt_ids
    assert transcript.response_ids == episode.response_ids
    assert transcript.loss_mask == episode.loss_mask
    # the loss falls on the three actions and nothing else
    trained = [t for t, m in zip(transcript.response_ids, transcript.loss_mask) if m]
    assert tokenizer.decode(trained) == "".join(actions)


def test_an_agent_turn_that_ends_on_eos_trains_the_eos(tokenizer):
    # without stop strings (a plain chat model) the engine ends a turn by sampling eos: SFT must teach it
    episode, _ = _play(tokenizer, ["<search> Velnor Kastrin </search>", "<answer> Belmoria </answer>"], eos_after=True)
    transcript = TranscriptTokenizer(tokenizer, stop_strings=())(episode.messages())
    assert transcript.response_ids == episode.response_ids and transcript.loss_mask == episode.loss_mask
    eos_positions = [i for i, t in enumerate(transcript.response_ids) if t == tokenizer.eos_token_id and transcript.loss_mask[i]]
    assert len(eos_positions) == 2  # one per agent turn


def test_a_final_plain_answer_gets_eos_and_trailing_messages_are_dropped(tokenizer):
    layout = TranscriptTokenizer(tokenizer, stop_strings=("</answer>",))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "thanks"}]
    transcript = layout(messages)
    assert transcript.prompt_ids == tokenize_prompts([messages[:2]], tokenizer)[0]
    assert transcript.response_ids == tokenizer.encode("4", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert transcript.loss_mask == [1] * len(transcript.response_ids)


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "role 'robot'"),
    ([{"role": "assistant", "content": "hi"}], "starts with an assistant"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "o1"},
      {"role": "tool", "content": "o2"}, {"role": "assistant", "content": "b"}], "merge them"),
    ([{"role": "user", "content": 3}], "str 'content'"),
    ("hello", "not a non-empty list"),
])
def test_malformed_conversations_are_refused(tokenizer, messages, message):
    with pytest.raises(TranscriptError, match=message):
        TranscriptTokenizer(tokenizer)(messages)


def test_a_tokenizer_without_a_chat_template_is_refused(tokenizer):
    import copy

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        TranscriptTokenizer(plain)


def test_cut_observations_are_kept_as_shown(tokenizer):
    # an observation cut to max_obs_length is stored as the model saw it, so the transcript still matches
    sample = EpisodeSample([{"role": "user", "content": "In which country was Velnor Kastrin born?"}], {"target": ["Belmoria"]})
    prompt = tokenize_prompts([sample.prompt], tokenizer)[0]
    turns = iter(["<search> Velnor Kastrin </search>", "<answer> Belmoria </answer>"])

    def generate(contexts, max_new_tokens, stop, request_keys):
        tokens = tokenizer.encode(next(turns), add_special_tokens=False)
        return [TurnOutput(tokens, [-0.1] * len(tokens), "stop")]

    env = SearchEnv(IndexRetriever(), topk=2)
    config = AgentLoopConfig(max_response_length=512, max_turns=3, max_turn_tokens=32, max_obs_length=30)
    (episode,) = run_episodes([env], [sample], [prompt], generate, ObservationRenderer(tokenizer), config)
    assert episode.observations_truncated == 1 and episode.observations[0].endswith("...(truncated)")
    transcript = TranscriptTokenizer(tokenizer, env.stop_strings)(episode.messages())
    assert transcript.response_ids == episode.response_ids and transcript.loss_mask == episode.loss_mask


def test_a_turn_that_goes_on_after_a_stop_string_is_refused(tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<search> a </search> and more"}]
    with pytest.raises(TranscriptError, match="goes on after the stop string '</search>'"):
        TranscriptTokenizer(tokenizer, ("</search>",))(messages)
