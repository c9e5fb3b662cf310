"""A mixture's rows (trainer/data_setup.py ``build_mixture_data``): three environments' datasets as their own
preparers write them (arithmetic, a reasoning-gym task, a TextArena game), each row tagged with its source, and
every training batch holding the sources exactly as their weights allocate it (largest remainder), resumed exactly."""

import math
from collections import Counter

import pytest

from posttrain import keys
from posttrain.cli.preflight import load_run_config
from posttrain.config.mixture import mixture_sources
from posttrain.errors import InputError
from posttrain.models import cached_tiny_model, load_tokenizer
from posttrain.trainer.data_setup import build_mixture_data
from tests.data.helpers import write_parquet

THREE = ("mixture=[{name: arith, weight: 3, data: {builtin: arithmetic, builtin_options: {train_size: 40, val_size: 4}}}, "
         "{name: rg, weight: 2, data: {builtin: reasoning-gym, builtin_options: {tasks: chain_sum, size: 30, test_size: 3}}}, "
         "{name: guess, weight: 1, data: {builtin: textarena, builtin_options: {id: GuessTheNumber-v0, size: 12, test_size: 2}}, "
         "env: {name: textarena, options: {id: GuessTheNumber-v0}}}]")
SHARES = {"arith": 3 / 6, "rg": 2 / 6, "guess": 1 / 6}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(cached_tiny_model("llama"))


def data_of(tokenizer, *overrides: str, training: bool = True):
    config = load_run_config([], [THREE, "data.train_batch_size=8", "data.max_prompt_length=256", *overrides])
    return build_mixture_data(config.data, mixture_sources(config), tokenizer, training)


def counts(batch) -> Counter:
    return Counter(batch[keys.SOURCE])


def test_every_batch_holds_each_source_by_its_weight_rounded_down_or_up_and_the_run_by_its_share(tokenizer):
    data = data_of(tokenizer)
    given = Counter()
    for number, batch in enumerate(list(data.train)[:8], start=1):
        got = counts(batch)
        assert sum(got.values()) == 8
        for name, share in SHARES.items():
            assert got[name] in (math.floor(8 * share), math.ceil(8 * share)), (number, got)
            given[name] += got[name]
            assert abs(given[name] - 8 * number * share) < 1, (number, given)  # the run's count stays within a row of its share
        # each row's source is its own: the game's rows are the game's prompts, the arithmetic's the arithmetic's
        sources = dict(zip(batch[keys.SOURCE], batch[keys.DATA_SOURCE]))
        assert sources == {"arith": "arithmetic", "rg": "reasoning_gym", "guess": "textarena"}


def test_the_held_out_rows_of_every_source_are_validated_each_tagged(tokenizer):
    data = data_of(tokenizer, training=False)
    assert data.train is None
    assert Counter(sample.source for sample in data.val_dataset.samples) == {"arith": 4, "rg": 3, "guess": 2}
    assert set(data.data_dir) == {"arith", "rg", "guess"}  # each source's own directory (a corpus may sit beside it)


def test_a_resumed_loader_continues_with_the_same_batches(tokenizer):
    first = data_of(tokenizer).train
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    rest = [list(next(iterator)[keys.EXTRA_INFO]) for _ in range(3)]
    resumed = data_of(tokenizer).train
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert [list(next(again)[keys.EXTRA_INFO]) for _ in range(3)] == rest


def test_a_source_with_no_rows_is_refused_by_its_name(tokenizer, tmp_path):
    empty = write_parquet(tmp_path / "empty.parquet", [])
    config = load_run_config([], [THREE.replace("{name: guess,", f"{{name: none, weight: 1, data: {{train_files: [{empty}], val_files: [{empty}]}}}}, {{name: guess,"),
                                  "data.train_batch_size=8"])
    with pytest.raises(InputError, match="mixture source 'none'"):
        build_mixture_data(config.data, mixture_sources(config), tokenizer)
