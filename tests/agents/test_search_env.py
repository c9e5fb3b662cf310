"""The search environment: SQuAD exact match, action parsing, observations, batched retrieval, failures."""

import numpy as np
import pytest

from posttrain.agents.env import EpisodeSample
from posttrain.agents.retriever.types import Document, Hit, RetrieverError
from posttrain.agents.search import SearchEnv, exact_match, normalize_answer

HOW = "To search, write your query between <search> and </search>. To answer, write the answer between <answer> and </answer>."
INVALID = f"Your previous action is invalid. {HOW}"


class FakeRetriever:
    """Answers query q with hits '"q-1"\\ntext of q 1', ...; records every call; fails on request."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.fail = fail

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.calls.append((list(queries), topk))
        if self.fail:
            raise RetrieverError("connection refused by http://127.0.0.1:8000")
        return [[Hit(Document(f"{q}{i}", f'"{q}-{i}"\ntext of {q} {i}'), 1.0 / i) for i in range(1, topk + 1)] for q in queries]


def _env(retriever=None, gold="Paris", **options) -> SearchEnv:
    env = SearchEnv(retriever or FakeRetriever(), **options)
    prompt = [{"role": "user", "content": f"Which city is the capital of France? (not Lyon, it is {gold})"}]
    assert env.reset(EpisodeSample(prompt=prompt, ground_truth={"target": [gold]})) == ""
    return env


def test_normalisation_by_hand():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"  # punctuation is deleted, not spaced
    assert normalize_answer("  An apple a day,\tthe doctor ") == "apple day doctor"
    assert normalize_answer("Theatre") == "theatre"  # an article only as a whole word
    assert exact_match("The  Eiffel-Tower!", "eiffeltower")
    assert not exact_match("The  Eiffel-Tower!", "eiffel tower")
    assert exact_match("the Dorsha river.", ["Dorsha", "Dorsha River"])  # any gold of a list
    assert exact_match("PARIS", {"target": np.array(["Lyon", "Paris"], dtype=object)})  # as Parquet gives it
    assert exact_match("paris", ("Paris",)) and not exact_match("Paris, France", "Paris")
    with pytest.raises(ValueError, match="has no 'target'"):
        exact_match("x", {"answer": "x"})
    with pytest.raises(ValueError, match="non-empty list of str"):
        exact_match("x", [])


def test_answer_rewards_exact_match_of_the_action_only():
    env = _env()
    result = env.step("Paris is the capital, I recall. <answer> paris </answer>")
    assert (result.observation, result.reward, result.done) == ("", 1.0, True)
    assert result.info.valid and result.info.effective and result.info.success and result.info.counts == {"answers": 1}
    wrong = _env().step("<answer>Lyon</answer>")
    assert (wrong.reward, wrong.done, wrong.info.success) == (0.0, True, False)
    # the gold sits in the prompt and in the reasoning, but the answer given is wrong: no reward
    assert _env().step("It could be Paris. <answer> I do not know </answer>").reward == 0.0
    assert _env(format_score=0.2).step("<answer>Lyon</answer>").reward == 0.2
    assert _env(format_score=0.2).step("<answer>  </answer>").reward == 0.0  # an empty answer is not well-formed


def test_search_observation_has_search_r1_format():
    retriever = FakeRetriever()
    env = _env(retriever, topk=2)
    result = env.step("I need the capital.\n<search>  capital of France </search>")
    assert retriever.calls == [(["capital of France"], 2)]
    assert result.observation == (
        "\n<information>Doc 1 (Title: capital of France-1) text of capital of France 1\n"
        "Doc 2 (Title: capital of France-2) text of capital of France 2</information>\n"
    )
    assert (result.reward, result.done) == (0.0, False)
    assert result.info.valid and result.info.effective and result.info.counts == {"searches": 1}


def test_the_first_complete_block_is_the_action():
    retriever = FakeRetriever()
    both = _env(retriever).step("<search>q1</search> then <answer>Paris</answer>")
    assert not both.done and retriever.calls == [(["q1"], 3)]
    assert _env().step("<answer>Paris</answer><search>q1</search>").reward == 1.0
    # an unclosed <search> is skipped; the complete answer block after it is the action
    assert _env().step("<search> capital <answer> Paris </answer>").reward == 1.0


@pytest.mark.parametrize("action", ["<search> capital of France", "Paris is the answer.", "<search> q <answer> Paris", "", "</search>"])
def test_turns_without_a_complete_block_are_invalid(action):
    retriever = FakeRetriever()
    result = _env(retriever, invalid_action_penalty=-0.5).step(action)
    assert (result.observation, result.reward, result.done) == (INVALID, -0.5, False)
    assert not result.info.valid and not result.info.effective and result.info.counts == {"invalid": 1}
    assert retriever.calls == []


def test_empty_query_is_invalid_and_long_queries_are_cut():
    retriever = FakeRetriever()
    empty = _env(retriever, invalid_action_penalty=-0.1).step("<search> \n </search>")
    assert empty.observation == f"Your search query was empty. {HOW}"
    assert (empty.reward, empty.done, empty.info.valid, empty.info.effective) == (-0.1, False, False, False)
    assert empty.info.counts == {"invalid": 1, "empty_queries": 1} and retriever.calls == []
    long = _env(retriever, max_query_chars=5).step("<search>abcdefgh</search>")
    assert retriever.calls == [(["abcde"], 3)] and long.info.counts == {"truncated_queries": 1, "searches": 1}


def test_retriever_errors_do_not_raise():
    result = _env(FakeRetriever(fail=True)).step("<search>capital</search>")
    assert result.observation == f"\n<information>The search failed. {HOW}</information>\n"
    assert (result.reward, result.done, result.info.valid, result.info.effective) == (0.0, False, True, False)
    assert result.info.counts == {"retriever_errors": 1}


def test_step_batch_sends_one_call_and_equals_step():
    actions = ["<search>alpha</search>", "<answer>Paris</answer>", "nothing here", "<search>beta</search>", "<search> </search>", "<search>gamma</search>"]
    topks = [2, 3, 3, 1, 3, 3]
    shared = FakeRetriever()
    batch_envs = [_env(shared, topk=k) for k in topks]
    batched = SearchEnv.step_batch(batch_envs, actions)
    assert shared.calls == [(["alpha", "beta", "gamma"], 3)]  # searching episodes only, in order, largest topk
    one_by_one = [_env(FakeRetriever(), topk=k).step(action) for k, action in zip(topks, actions)]
    assert batched == one_by_one
    assert batched[3].observation.count("Doc ") == 1  # each episode keeps its own topk


def test_step_batch_groups_by_retriever_and_survives_failures():
    first, broken = FakeRetriever(), FakeRetriever(fail=True)
    envs = [_env(first), _env(broken), _env(first), _env(broken)]
    results = SearchEnv.step_batch(envs, ["<search>a</search>", "<search>b</search>", "<search>c</search>", "<answer>Paris</answer>"])
    assert first.calls == [(["a", "c"], 3)] and broken.calls == [(["b"], 3)]
    assert [r.info.counts for r in results] == [{"searches": 1}, {"retriever_errors": 1}, {"searches": 1}, {"answers": 1}]
    assert results[3].reward == 1.0


def test_final_turn_answers_or_is_invalid():
    retriever = FakeRetriever()
    env = _env(retriever, invalid_action_penalty=-0.2)
    assert "<answer>" in env.final_turn_instruction() and "no searches left" in env.final_turn_instruction()
    searched = env.finish("<search>one more</search>")
    assert (searched.reward, searched.done, searched.info.valid, searched.info.counts) == (-0.2, True, False, {"invalid": 1})
    assert retriever.calls == []  # the search was not run
    answered = _env().finish("<answer>Paris</answer>")
    assert (answered.reward, answered.done, answered.info.success) == (1.0, True, True)
    assert _env(invalid_action_penalty=-0.2).finish("rambling").reward == -0.2


def test_options_and_ground_truth_shapes():
    env = SearchEnv(FakeRetriever(), search_tag="query", answer_tag="final")
    assert env.stop_strings == ("</query>", "</final>")
    env.reset(EpisodeSample(prompt=[], ground_truth=np.array(["1874"], dtype=object)))
    assert env.step("<final>1874</final>").reward == 1.0
    env.reset(EpisodeSample(prompt=[], ground_truth="Velsador"))
    assert env.step("<final>velsador</final>").info.success
    assert "between <query> and </query>. To answer, write the answer between <final> and </final>." in env.step("<search>x</search>").observation
    with pytest.raises(ValueError, match="invalid_action_penalty=0.5 .* must be <= 0"):
        SearchEnv(FakeRetriever(), invalid_action_penalty=0.5)
    with pytest.raises(ValueError, match="topk=0 must be 1 to 100"):
        SearchEnv(FakeRetriever(), topk=0)
    with pytest.raises(RuntimeError, match="call reset"):
        SearchEnv(FakeRetriever()).step("<answer>x</answer>")


def test_finding_the_evidence_is_rewarded_once_per_episode():
    class Encyclopedia:
        def retrieve(self, queries, topk):
            return [[Hit(Document("1", '"Rube"\nThe Dorfen River runs through Rube.'), 1.0)] if "Rube" in q else [] for q in queries]

    env = SearchEnv(Encyclopedia(), search_hit_score=0.2)
    env.reset(EpisodeSample([], {"target": ["Dorfen", "Dorfen River"]}))
    miss, hit, again = env.step("<search> Lyon </search>"), env.step("<search> Rube </search>"), env.step("<search>Rube</search>")
    assert (miss.reward, hit.reward, again.reward) == (0.0, 0.2, 0.0)
    assert hit.info.counts["evidence_found"] == 1 and "evidence_found" not in again.info.counts
    # whole words only: "Dorfen" is not found inside "Dorfenland"
    env.reset(EpisodeSample([], {"target": ["Dorf"]}))
    assert env.step("<search> Rube </search>").reward == 0.0
    with pytest.raises(ValueError, match="search_hit_score=1"):
        SearchEnv(Encyclopedia(), search_hit_score=1)


def test_each_answered_search_costs_search_penalty_and_a_failed_one_does_not():
    class Encyclopedia:
        def retrieve(self, queries, topk):
            if "down" in queries[0]:
                raise RetrieverError("retriever down")
            return [[Hit(Document("1", '"Rube"\nThe Dorfen River runs through Rube.'), 1.0)] if "Rube" in q else [] for q in queries]

    env = SearchEnv(Encyclopedia(), search_hit_score=0.2, search_penalty=-0.01)
    env.reset(EpisodeSample([], {"target": ["Dorfen"]}))
    rewards = [env.step(f"<search> {query} </search>").reward for query in ("Lyon", "Rube", "Rube", "down")]
    assert rewards == pytest.approx([-0.01, 0.19, -0.01, 0.0])  # the retriever's failure is not the agent's
    assert env.step("<answer> Dorfen </answer>").reward == 1.0
    with pytest.raises(ValueError, match="search_penalty=0.1 .* must be <= 0"):
        SearchEnv(Encyclopedia(), search_penalty=0.1)
    with pytest.raises(ValueError, match="search_penalty=nan"):
        SearchEnv(Encyclopedia(), search_penalty=float("nan"))


def test_a_search_repeating_an_answered_query_costs_repeated_search_penalty():
    class Encyclopedia:
        def __init__(self):
            self.down = False

        def retrieve(self, queries, topk):
            if self.down:
                raise RetrieverError("retriever down")
            return [[Hit(Document("1", '"Rube"\nThe Dorfen River runs through Rube.'), 1.0)] if "Rube" in q else [] for q in queries]

    encyclopedia = Encyclopedia()
    env = SearchEnv(encyclopedia, search_hit_score=0.2, search_penalty=-0.01, repeated_search_penalty=-0.1)
    env.reset(EpisodeSample([], {"target": ["Dorfen"]}))
    encyclopedia.down = True
    failed = env.step("<search> Lyon </search>")  # not answered: retrying it is no repeat
    encyclopedia.down = False
    steps = [env.step(f"<search>{query}</search>") for query in ("Lyon", "Rube", " rube. ", "Lyon", "the Rube")]
    assert failed.reward == 0.0
    # normalised as answers are: case, punctuation, articles and spaces do not make a new query
    assert [step.reward for step in steps] == pytest.approx([-0.01, 0.19, -0.11, -0.11, -0.11])
    assert [step.info.counts.get("repeated_searches", 0) for step in steps] == [0, 0, 1, 1, 1]
    assert all(step.info.counts["searches"] == 1 for step in steps)
    env.reset(EpisodeSample([], {"target": ["Dorfen"]}))  # a new episode remembers nothing
    assert env.step("<search> Rube </search>").reward == pytest.approx(0.19)
    with pytest.raises(ValueError, match="repeated_search_penalty=0.1 .* must be <= 0"):
        SearchEnv(encyclopedia, repeated_search_penalty=0.1)


def test_search_r1_parquet_rows_feed_the_environment(tmp_path):
    """A row as Search-R1's NQ/HotpotQA files hold it (extra top-level columns included)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from posttrain.data.format import read_rows

    table = pa.Table.from_pylist([{
        "id": "train_0", "question": "who got the first nobel prize in physics", "golden_answers": ["Wilhelm Conrad Röntgen"],
        "data_source": "nq", "prompt": [{"role": "user", "content": "Answer the given question. ... Question: who got the first nobel prize in physics?"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Wilhelm Conrad Röntgen", "Röntgen"]}},
        "extra_info": {"split": "train", "index": 0},
    }])
    pq.write_table(table, tmp_path / "nq.parquet")
    row = read_rows([tmp_path / "nq.parquet"])[0]
    env = SearchEnv(FakeRetriever())
    env.reset(EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info))
    assert env.step("<answer> röntgen </answer>").info.success
    env.reset(EpisodeSample(row.messages, row.ground_truth, row.data_source, row.extra_info))
    assert not env.step("<answer> Marie Curie </answer>").info.success
