"""A mixture's rollout (rollout/mixture.py): each row goes to its source's rollout, the pieces come back as one
batch, and what is decided across a training batch is each source's own, over its own rows."""

import numpy as np
import pytest
import torch

from posttrain import keys
from posttrain.agents.env import EpisodeSample
from posttrain.config.mixture import MixtureSource
from posttrain.config.schema import PosttrainConfig
from posttrain.data import RLDataset
from posttrain.metrics import total, values
from posttrain.protocol import Batch, pad_rows
from posttrain.rollout import MixtureRollout, join_rollouts, repeat_for_groups
from posttrain.rollout.batching import prompt_token_lists, sequences_to_batch
from posttrain.trainer.validation import episode_rows, item_groups, item_key, summarize_rows, validation_metrics


class Tokens:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(i)) for i in ids)


class FakePart:
    """A source's rollout: responses of ``score`` each (an episode's columns where ``episodes``), a count metric,
    and a finish that multiplies its rows' scores by 10 (and says which rows it saw)."""

    def __init__(self, score: float, episodes: bool) -> None:
        self.score, self.episodes = score, episodes
        self.calls, self.finished, self.checked, self.before = [], [], {}, None
        self.first_failures = {"reward": "boom"} if episodes else {}
        self.stop_strings = ("]",) if episodes else ()
        self.opened = self.closed = False

    def check_data(self, **datasets):
        self.checked = {split: [s.row for s in d.samples] if d is not None else None for split, d in datasets.items()}

    def open(self, roles):
        self.opened = True

    def close(self):
        self.closed = True

    def before_training(self, samples):
        self.before = [s.prompt[0]["content"] for s in samples]

    def __call__(self, roles, batch, *, validate=False, timings=None, whole_batch=True):
        assert not whole_batch
        self.calls.append((list(batch[keys.UID]), validate, batch[keys.PROMPT_MASK][:, 0].tolist()))
        prompts = prompt_token_lists(batch)
        made = sequences_to_batch(prompts, [[7] * (2 + i % 2) for i in range(len(prompts))], pad_token_id=0, response_width=6)
        made.tensors[keys.TOKEN_SCORES] = torch.zeros(len(prompts), 6)
        made.tensors[keys.TOKEN_SCORES][:, 1] = self.score
        if self.episodes:
            made.non_tensors[keys.TRANSCRIPT] = np.array([[{"role": "user", "content": "hi"}]] * len(prompts) + [None], dtype=object)[:-1]
            made.non_tensors[keys.EPISODE_STATS] = np.array([{"num_turns": 3.0}] * len(prompts), dtype=object)
            made.non_tensors["reward_extra/acc"] = np.ones(len(prompts))
        made.meta[keys.WEIGHT_VERSION] = 5 if self.episodes else 6
        timings["gen"] = timings.get("gen", 0.0) + 1.0
        return batch.union(made), {"env/things": total(len(prompts))}

    def finish_batch(self, batch, metrics):
        self.finished.append(list(batch[keys.UID]))
        batch.tensors[keys.TOKEN_SCORES] = batch[keys.TOKEN_SCORES] * 10
        return batch, metrics | {"finished": total(len(batch))}


SOURCES = [MixtureSource("arith", 0.5, PosttrainConfig(), 8), MixtureSource("game", 0.5, PosttrainConfig(), 64)]


def mixture() -> MixtureRollout:
    parts = {"arith": FakePart(1.0, episodes=False), "game": FakePart(0.5, episodes=True)}
    return MixtureRollout(SOURCES, lambda source: parts[source.name], pad_token_id=0)


def prompts(sources: list[str], lengths: list[int]) -> Batch:
    """Prompt rows of ``sources``, left-padded to the longest, as the loader makes a mixture's batch."""
    ids = [[3 + i] * length for i, length in enumerate(lengths)]
    return Batch.from_dict(
        {keys.PROMPT_IDS: pad_rows(ids, max(lengths), 0, left=True), keys.PROMPT_MASK: pad_rows([[1] * n for n in lengths], max(lengths), left=True)},
        non_tensors={keys.SOURCE: sources, keys.UID: [f"u{i}" for i in range(len(sources))], keys.DATA_SOURCE: sources,
                     keys.RAW_PROMPT: [[{"role": "user", "content": f"q{i}"}] for i in range(len(sources))],
                     keys.GROUND_TRUTH: ["1"] * len(sources), keys.EXTRA_INFO: [{}] * len(sources)},
    )


def test_each_source_gets_its_own_rows_with_its_own_prompt_padding_and_the_pieces_come_back_as_one_batch():
    rollout = mixture()
    batch = repeat_for_groups(prompts(["game", "arith", "game", "arith"], [2, 5, 3, 1]), 2)
    timings = {}
    joined, metrics = rollout(None, batch, timings=timings, whole_batch=False)
    (arith_uids, _, arith_first), = rollout.parts["arith"].calls
    (game_uids, _, game_first), = rollout.parts["game"].calls
    assert arith_uids == ["u1", "u1", "u3", "u3"] and game_uids == ["u0", "u0", "u2", "u2"]
    assert 1 in arith_first and 1 in game_first  # each piece's prompts padded to its own longest, not the batch's
    # back in the batch's order of prompts, so that the group ids still number the prompts (ReMax's baseline reads them)
    assert list(joined[keys.UID]) == list(batch[keys.UID]) and joined[keys.PROMPT_IDS].shape[1] == 5
    assert joined[keys.GROUP_IDS].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [joined[keys.TRANSCRIPT][i] is None for i in range(8)] == [False, False, True, True] * 2  # a single turn has none
    # a column one piece lacks: empty there, as for an unscored sample (its accuracy is then score > 0)
    assert list(joined["reward_extra/acc"]) == [1.0, 1.0, None, None] * 2
    assert joined.meta[keys.WEIGHT_VERSION] == 5  # the oldest weights of any piece
    found = values(metrics)
    assert found["env/things"] == 8 and found["mixture/arith/samples"] == 4 and found["mixture/game/samples"] == 4
    assert (found["mixture/arith/score"], found["mixture/game/score"], found["mixture/game/acc"]) == (1.0, 0.5, 1.0)
    assert timings["gen"] == 2.0 and rollout.first_failures == {"reward (game)": "boom"}
    assert rollout.stop_strings == ("]",)


def test_what_is_decided_across_a_batch_is_each_sources_own_over_its_own_rows():
    rollout = mixture()
    batch, metrics = rollout(None, repeat_for_groups(prompts(["arith", "game", "arith"], [2, 2, 2]), 2))  # a training batch
    assert rollout.parts["arith"].finished == [["u0", "u0", "u2", "u2"]] and rollout.parts["game"].finished == [["u1", "u1"]]
    assert batch[keys.TOKEN_SCORES].sum(-1).tolist() == [10.0, 10.0, 5.0, 5.0, 10.0, 10.0]  # each row still where its prompt was
    assert values(metrics)["finished"] == 6


def test_validation_passes_through_and_names_each_source_in_metrics_and_episode_rows():
    rollout = mixture()
    batch, _ = rollout(None, prompts(["arith", "game"], [2, 3]), validate=True)
    assert rollout.parts["arith"].calls[0][1] is True and not rollout.parts["arith"].finished
    batch.non_tensors[keys.DATA_SOURCE] = np.array(["same", "same"], dtype=object)  # two sources may share a data source
    metrics = validation_metrics(batch, 1)
    assert metrics["val/arith/reward/mean@1"] == 1.0 and metrics["val/game/reward/mean@1"] == 0.5 and "val/same/acc/mean@1" not in metrics
    rows = episode_rows(batch, Tokens())
    assert [row["source"] for row in rows] == ["arith", "game"]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "7 7"} and rows[0]["stats"] == {}  # a single turn's row, decoded
    assert rows[1]["messages"] == [{"role": "user", "content": "hi"}] and rows[1]["stats"] == {"num_turns": 3.0}
    # `posttrain eval --by source`, `compare --by source` and a recipe's table group by the row's source
    assert {name: summary["reward"] for name, summary in summarize_rows(rows, by="source").items()} == \
        {"all": 0.75, "source=arith": 1.0, "source=game": 0.5}
    assert item_groups([item_key(row) for row in rows], {item_key(row): row for row in rows}, "source")["source=game"] == [item_key(rows[1])]
    assert item_key(rows[0]) != item_key(rows[0] | {"source": "game"})  # two sources may hold the same rows


def test_majority_votes_are_reported_only_for_the_sources_that_predict():
    rollout = mixture()
    batch, _ = rollout(None, prompts(["arith", "arith", "game", "game"], [2, 2, 3, 3]).repeat(2, interleave=True), validate=True)
    batch.non_tensors["reward_extra/pred"] = np.array([4.0, 4.0, 7.0, float("nan")] + [None] * 4, dtype=object)
    metrics = validation_metrics(batch, 2)
    assert metrics["val/arith/acc/maj@2"] == 1.0 and "val/game/acc/maj@2" not in metrics


def test_checks_and_resources_go_to_each_source_with_its_own_rows():
    rollout = mixture()
    dataset = RLDataset.__new__(RLDataset)  # its rows only: the checks read .samples
    dataset.samples = [type("S", (), {"row": i, "source": name})() for i, name in enumerate(["arith", "game", "arith"])]
    rollout.check_data(training=dataset, validation=None)
    assert rollout.parts["arith"].checked == {"training": [0, 2], "validation": None} and rollout.parts["game"].checked["training"] == [1]
    rollout.before_training([EpisodeSample([{"role": "user", "content": c}], "1", "x", {}, s) for c, s in (("a", "arith"), ("g", "game"))])
    assert rollout.parts["arith"].before == ["a"] and rollout.parts["game"].before == ["g"]
    rollout.open(None)
    rollout.close()
    assert all(part.opened and part.closed for part in rollout.parts.values())


def test_a_row_of_no_source_or_of_another_mixture_is_refused():
    rollout = mixture()
    with pytest.raises(ValueError, match="does not have"):
        rollout(None, prompts(["arith", "other"], [1, 1]), validate=True)
    bare = prompts(["arith"], [1])
    bare.non_tensors.pop(keys.SOURCE)
    with pytest.raises(ValueError, match="carry their source"):
        rollout(None, bare, validate=True)


def test_join_names_each_row_without_an_episode_id_an_episode_of_its_own_and_refuses_tensors_one_piece_lacks():
    first = sequences_to_batch([[1, 2]], [[3]], pad_token_id=0)
    second = sequences_to_batch([[1], [2]], [[3], [4]], pad_token_id=0)
    second.non_tensors[keys.EPISODE_IDS] = np.array(["e", "e"], dtype=object)
    joined = join_rollouts([first, second, first], 0)
    ids = list(joined[keys.EPISODE_IDS])
    assert ids[1:3] == ["e", "e"] and len({ids[0], ids[3], "e"}) == 3
    again = join_rollouts([first, second], 0)  # another join (a second round, another unit): its own ids too
    assert again[keys.EPISODE_IDS][0] not in ids
    second.tensors[keys.VALUES] = torch.zeros(2, 1)
    with pytest.raises(ValueError, match="lacks the tensors"):
        join_rollouts([first, second], 0)
