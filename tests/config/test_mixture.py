"""A mixture's config (config/mixture.py): each source is the run's config with its own sections over it, and
what cannot work is refused before any worker starts, named by its source."""

import pytest

from posttrain.cli.preflight import load_run_config
from posttrain.config import ConfigError
from posttrain.config.mixture import mixture_sources

ARITH = "{name: arith, weight: 3, data: {builtin: arithmetic, builtin_options: {train_size: 8, val_size: 4}, max_response_length: 16}}"
GAME = ("{name: guess, weight: 1, data: {builtin: textarena, builtin_options: {id: GuessTheNumber-v0, size: 8, test_size: 4}}, "
        "env: {name: textarena, options: {id: GuessTheNumber-v0}, max_turns: 3}}")


def mixture(*sources: str) -> str:
    return f"mixture=[{', '.join(sources)}]"


def load(*overrides: str):
    return load_run_config([], list(overrides))


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load(*overrides)
    return [str(problem) for problem in error.value.problems]


def test_each_source_is_the_runs_config_with_its_own_sections_over_it():
    config = load(mixture(ARITH, GAME), "env.max_turn_tokens=24", "data.max_response_length=64", "env.llm.max_tokens=20")
    arith, guess = mixture_sources(config)
    assert (arith.name, arith.share, guess.name, guess.share) == ("arith", 0.75, "guess", 0.25)
    assert (arith.config.data.builtin, arith.config.env.name) == ("arithmetic", None)
    assert (guess.config.data.builtin, guess.config.env.name, guess.config.env.options["id"]) == ("textarena", "textarena", "GuessTheNumber-v0")
    assert guess.config.env.max_turns == 3 and guess.config.env.max_turn_tokens == 24  # its own, and the run's where it sets none
    assert guess.config.env.llm.max_tokens == 20  # the one Env-LLM is the run's
    # a source's max_response_length is its generation budget; every batch is the run's width
    assert (arith.max_new_tokens, arith.config.data.max_response_length, guess.max_new_tokens) == (16, 64, 64)
    assert arith.config.mixture == [] and config.data.train_batch_size == arith.config.data.train_batch_size


def test_no_mixture_has_no_sources():
    assert mixture_sources(load()) == []


@pytest.mark.parametrize("overrides, fragment", [
    ([mixture(ARITH)], "mixture = "),  # one source is no mixture
    ([mixture(ARITH, GAME.replace("weight: 1", "weight: 0"))], "mixture[1].weight = 0"),
    ([mixture(ARITH, GAME.replace("weight: 1", "weight: -2"))], "mixture[1].weight = -2"),
    ([mixture(ARITH, GAME.replace("weight: 1", "weight: heavy"))], "mixture[1].weight = 'heavy'"),
    ([mixture(ARITH, GAME.replace("name: guess", "name: arith"))], "mixture[1].name = 'arith'"),
    ([mixture(ARITH, GAME.replace("name: guess", "name: 'a/b'"))], "mixture[1].name = 'a/b'"),
    ([mixture(ARITH, GAME.replace("name: guess,", "name: guess, trainer: {seed: 3},"))], "mixture[1] = ['trainer']"),
    ([mixture(ARITH.replace("max_response_length: 16", "train_batch_size: 4"), GAME)], "mixture[0].data.train_batch_size = 4"),
    ([mixture(ARITH, GAME.replace("max_turns: 3", "max_turns: 3, llm: {max_tokens: 9}"))], "mixture[1].env.llm = "),
    ([mixture(ARITH.replace("max_response_length: 16", "max_response_length: 999"), GAME)], "mixture[0].data.max_response_length = 999"),
    ([mixture(ARITH, "{name: empty, weight: 1}")], "mixture[1].data = {}"),  # names no rows
    ([mixture(ARITH, GAME), "data.builtin=arithmetic"], "data = "),  # the top's data beside the mixture
    ([mixture(ARITH, GAME), "env.name=textarena"], "env.name = 'textarena'"),
    ([mixture(ARITH, GAME), "data.sampler.stratify_by=data_source"], "data.sampler = "),
    # each source judged as a run would be: an environment that cannot start, its options, a missing file
    ([mixture(ARITH, GAME.replace("name: textarena, options", "name: nosuch, options"))], "mixture[1].env.name = 'nosuch'"),
    ([mixture(ARITH, GAME.replace("max_turns: 3", "max_turns: 3, max_turn_tokens: 0"))], "mixture[1].env.max_turn_tokens = 0"),
    ([mixture(ARITH, "{name: files, weight: 1, data: {train_files: [/nowhere/train.parquet]}}")], "mixture[1].data.train_files"),
    # what the circuit breakers read over all sources is the run's
    ([mixture(ARITH, GAME.replace("max_turns: 3", "max_turns: 3, retriever: {stop_at_failed_fraction: 0.5}"))],
     "mixture[1].env.retriever.stop_at_failed_fraction = 0.5"),
    ([mixture(ARITH.replace("weight: 3,", "weight: 3, custom_reward_function: {stop_at_failed_fraction: 0.1},"), GAME)],
     "mixture[0].custom_reward_function.stop_at_failed_fraction = 0.1"),
    # a source's groups dropped by their spread would leave a batch the mini-batches cannot split
    ([mixture(ARITH, GAME.replace("max_turns: 3", "max_turns: 3, filter_groups_quantile: 0.5"))], "mixture[1].env.filter_groups_quantile = 0.5"),
    # the overlong buffer measures against the run's budget, not a source's smaller one
    ([mixture(ARITH, GAME), "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"],
     "mixture[0].data.max_response_length = 16"),
    # a rule over two sections, found in a source's config: a reward model beside an environment's rewards
    ([mixture(ARITH, GAME), "reward_model.enable=true", "reward_model.model_path=/nowhere"], "mixture[1].reward_model.enable = True"),
])
def test_a_mixture_that_cannot_work_is_refused_naming_the_source(overrides, fragment):
    found = problems(*overrides)
    assert any(line.startswith(fragment) for line in found), found
    assert all("(from command line)" in line for line in found if line.startswith("mixture")), found


def test_the_default_preset_beside_a_mixture_says_how_to_start_without_it(tmp_path):
    from posttrain.config import preset_path

    with pytest.raises(ConfigError) as error:
        load_run_config([preset_path("arithmetic_grpo")], [mixture(ARITH, GAME)])
    assert "--preset mixture_grpo" in str(error.value)


def test_sft_refuses_a_mixture():
    with pytest.raises(ConfigError, match="posttrain sft trains on one set of transcripts"):
        load_run_config([], [mixture(ARITH, GAME), "sft.train_files=[x.parquet]"], command="sft")


def test_the_preset_is_a_valid_mixture_of_three_sources():
    from posttrain.config import preset_path

    config = load_run_config([preset_path("mixture_grpo")], [])
    assert [(s.name, s.share) for s in mixture_sources(config)] == [("arithmetic", 0.25), ("reasoning_gym", 0.5), ("guess_the_number", 0.25)]


def test_async_generators_search_the_retriever_each_source_opened():
    from types import SimpleNamespace

    from posttrain.rollout import MixtureRollout
    from posttrain.trainer.async_.coordinator import generator_config, retriever_urls

    search = "{name: search, weight: 1, data: {builtin: synthetic-search}, env: {name: search}}"
    config = load(mixture(ARITH, search))
    opened = SimpleNamespace(retriever=SimpleNamespace(client=SimpleNamespace(url="http://127.0.0.1:9/")), stop_strings=())
    parts = {"arith": SimpleNamespace(stop_strings=()), "search": opened}
    rollout = MixtureRollout(mixture_sources(config), lambda source: parts[source.name], 0)
    urls = retriever_urls(rollout)
    assert urls == {"search": "http://127.0.0.1:9/"}
    arith, found = mixture_sources(generator_config(config, urls))
    assert (found.config.env.retriever.url, arith.config.env.retriever.url) == ("http://127.0.0.1:9/", None)
    assert config.mixture[1].get("env") == {"name": "search"}  # the run's own config is untouched
    assert retriever_urls(opened) == {None: "http://127.0.0.1:9/"}
    assert generator_config(load(), {None: "http://x/"}).env.retriever.url == "http://x/"
