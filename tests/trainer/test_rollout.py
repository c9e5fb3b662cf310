"""Episodes into a training Batch: token placement, reward placement, normalisation, group filtering."""

from __future__ import annotations

import pytest
import torch

from posttrain import keys
from posttrain.agents import Episode
from posttrain.engines.training.inputs import MODEL_INPUT_KEYS, check_batch
from posttrain.protocol import Batch
from posttrain.rollout.agent import episode_keys, episodes_to_batch, sampling_keys
from posttrain.rollout.groups import UpdateBatchShape, filter_groups, kept_group_count, normalize_rewards
from posttrain.workers.sampling import request_seed

PAD = 0


def _episode(prompt, turns, observations, rewards, *, success=False) -> Episode:
    """Agent turns (token lists, logprob -1 each) interleaved with observation token lists."""
    episode = Episode(prompt_ids=prompt, turn_budget=4, response_budget=64)
    for index, turn in enumerate(turns):
        episode.turn_starts.append(len(episode.response_ids))
        episode.response_ids += turn
        episode.loss_mask += [1] * len(turn)
        episode.logprobs += [-1.0] * len(turn)
        episode.turn_ends.append(len(episode.response_ids) - 1)
        if index < len(observations):
            episode.append_observation(observations[index])
    episode.turn_rewards = rewards
    episode.success, episode.done = success, True
    return episode


def test_tokens_masks_and_rewards_land_where_the_episode_put_them():
    first = _episode([5, 6, 7], [[11, 12], [13]], [[90, 91, 92]], [0.25, 1.0], success=True)
    second = _episode([8], [[21, 22, 23]], [], [-0.5])
    batch = episodes_to_batch([first, second], max_response_length=8, pad_token_id=PAD)
    assert batch[keys.PROMPT_IDS].tolist() == [[5, 6, 7], [PAD, PAD, 8]]
    assert batch[keys.PROMPT_MASK].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch[keys.RESPONSE_IDS].tolist() == [[11, 12, 90, 91, 92, 13, PAD, PAD], [21, 22, 23] + [PAD] * 5]
    assert batch[keys.RESPONSE_MASK].tolist() == [[1, 1, 0, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    # the model attends to observations too, only padding is masked out
    assert batch[keys.ATTENTION_MASK][:, -8:].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    assert batch[keys.BEHAVIOUR_LOGPROBS][0].tolist() == [-1, -1, 0, 0, 0, -1, 0, 0]
    # per-turn reward on each turn's last token: 0.25 after "11 12", the episode reward on "13"
    assert batch[keys.TOKEN_SCORES].tolist() == [[0, 0.25, 0, 0, 0, 1.0, 0, 0], [0, 0, -0.5, 0, 0, 0, 0, 0]]
    assert batch["reward_extra/acc"].tolist() == [1.0, 0.0]
    check_batch(batch, MODEL_INPUT_KEYS, "training")


def test_an_episode_longer_than_the_response_budget_is_refused():
    with pytest.raises(ValueError, match="more than max_response_length=2"):
        episodes_to_batch([_episode([1], [[2, 3, 4]], [], [0.0])], max_response_length=2, pad_token_id=PAD)


def _scored(rewards: list[float], groups: list[int]) -> Batch:
    scores = torch.zeros(len(rewards), 4)
    scores[:, 2] = torch.tensor(rewards)
    mask = torch.tensor([[1, 1, 1, 0]] * len(rewards))
    return Batch.from_dict({keys.TOKEN_SCORES: scores, keys.RESPONSE_MASK: mask, keys.GROUP_IDS: torch.tensor(groups)})


def test_group_normalisation_moves_the_episode_reward_on_the_final_agent_token():
    batch = normalize_rewards(_scored([1.0, 0.0, 2.0, 2.0], [0, 0, 1, 1]), "group")
    # group 0: mean 0.5, Bessel std 0.7071 → ±0.7071; group 1: all equal → 0
    assert batch[keys.TOKEN_SCORES][:, 2].tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)
    assert batch[keys.TOKEN_SCORES][:, [0, 1, 3]].abs().sum() == 0
    assert normalize_rewards(_scored([1.0, 0.0], [0, 0]), "none")[keys.TOKEN_SCORES][:, 2].tolist() == [1.0, 0.0]


def test_group_filter_drops_flat_groups_and_keeps_whole_mini_batches():
    # spreads: g0 0.5, g1 0, g2 0.25, g3 0
    batch = _scored([1.0, 0.0, 3.0, 3.0, 0.5, 0.0, 2.0, 2.0], [0, 0, 1, 1, 2, 2, 3, 3])
    kept, metrics = filter_groups(batch, 0.5, UpdateBatchShape(1, 2, 1), metrics={})
    assert kept[keys.GROUP_IDS].tolist() == [0, 0, 2, 2]
    assert metrics["agent/groups_kept_ratio"].value == 0.5
    # two groups per mini-batch: the two kept groups make one
    assert filter_groups(batch, 0.5, UpdateBatchShape(2, 2, 1), {})[0][keys.GROUP_IDS].tolist() == [0, 0, 2, 2]
    # three groups above a low threshold but two per mini-batch: the lowest-spread one goes
    three = _scored([1.0, 0.0, 3.0, 3.0, 0.5, 0.0, 2.0, 1.9], [0, 0, 1, 1, 2, 2, 3, 3])
    assert filter_groups(three, 0.25, UpdateBatchShape(2, 2, 1), {})[0][keys.GROUP_IDS].tolist() == [0, 0, 2, 2]
    assert filter_groups(batch, 0.0, UpdateBatchShape(2, 2, 1), {})[0] is batch


def test_kept_group_counts_split_into_mini_batches_and_ranks():
    assert [kept_group_count(k, UpdateBatchShape(4, 3, 2)) for k in (9, 8, 4, 3, 2, 1)] == [8, 8, 4, 2, 2, 0]
    # n=3 samples per group over 2 ranks: below a mini-batch only even group counts split
    assert kept_group_count(5, UpdateBatchShape(4, 2, 4)) == 4
    batch = _scored([1.0, 0.0, 3.0, 3.0, 0.5, 0.0, 2.0, 2.0], [0, 0, 1, 1, 2, 2, 3, 3])
    kept, metrics = filter_groups(batch, 0.9, UpdateBatchShape(2, 2, 4), {})  # 1 group × 2 samples cannot split over 4 ranks
    assert kept is batch and metrics["agent/groups_kept_ratio"].value == 1.0


def test_episode_keys_are_stable_and_tell_group_members_apart():
    a, b = [{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "3+3?"}]
    keys_ = episode_keys([a, a, b, a])
    assert keys_[0] != keys_[1] != keys_[3] and keys_[0].split("-")[0] == keys_[1].split("-")[0]
    assert episode_keys([b, a]) == [keys_[2], keys_[0]]
    assert episode_keys([[{"content": "2+2?", "role": "user"}]]) == [keys_[0]], "the messages decide, not their fields' order"


def test_sampling_keys_tell_apart_rows_with_the_same_messages_and_validation_seeds_differ_from_trainings():
    """Two dataset rows with the same messages, drawn into one step by different generator units (two batches
    here), must not sample the same tokens; a validation request must not repeat a training request's seed."""
    a = [{"role": "user", "content": "2+2?"}]

    def batch(uids):
        return Batch.from_dict(non_tensors={keys.RAW_PROMPT: [a] * len(uids), keys.UID: uids})

    first, second = sampling_keys(batch(["0:3", "0:3"])), sampling_keys(batch(["0:9", "0:9"]))
    assert len(set(first + second)) == 4 and first[0].endswith(episode_keys([a])[0])
    assert sampling_keys(batch(["0:3", "0:3"])) == first  # stable: a resumed run samples alike
    assert request_seed(1, 2, "k:0") == request_seed(1, 2, "k:0") != request_seed(1, 2, "k:0", validate=True)
    assert request_seed(1, 2, "k:0") != request_seed(1, 2, "k:1") != request_seed(1, 3, "k:1")


def test_a_retriever_that_is_down_or_a_missing_corpus_stops_the_run_with_the_fix(tmp_path):
    from posttrain.agents.retriever import RetrieverError
    from posttrain.agents.retriever.process import free_port
    from posttrain.config.schema import RetrieverConfig
    from posttrain.rollout.retriever import open_retriever

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrieverError, match="serve-retriever"):
        open_retriever(RetrieverConfig(url=url, retries=0, timeout_s=1.0), None)
    with pytest.raises(ValueError, match="env.retriever.corpus=PATH.jsonl"):
        open_retriever(RetrieverConfig(), tmp_path)


def _episodes(scored: Batch, ids: list[str]) -> Batch:
    scored.non_tensors[keys.EPISODE_IDS] = __import__("numpy").array(ids, dtype=object)
    return scored


def test_where_an_episode_gave_several_samples_normalisation_counts_it_once_and_moves_them_all():
    # group 0: episode a (two samples, 1.0) and b (0.0): ±0.7071 as for two episodes, a's on both of its samples
    batch = normalize_rewards(_episodes(_scored([1.0, 1.0, 0.0], [0, 0, 0]), ["a", "a", "b"]), "group")
    assert batch[keys.TOKEN_SCORES][:, 2].tolist() == pytest.approx([0.7071, 0.7071, -0.7071], abs=1e-4)


def test_a_batch_of_episodes_is_filled_to_the_ranks_with_rows_that_train_nothing_and_tells_its_group_count():
    from posttrain.rollout.groups import fill_episode_batch

    batch = _episodes(_scored([1.0, 1.0, 0.0], [0, 0, 3]), ["a", "a", "b"])
    filled = fill_episode_batch(batch, ranks=2)
    assert len(filled) == 4 and filled.meta[keys.GROUP_COUNT] == 2
    assert filled[keys.RESPONSE_MASK][3].sum() == 0 and filled[keys.EPISODE_IDS][3] == "b"  # in the last row's episode
    assert torch.equal(filled[keys.RESPONSE_MASK][:3], batch[keys.RESPONSE_MASK])
    assert len(fill_episode_batch(batch, ranks=1)) == 3 and len(fill_episode_batch(batch, ranks=3)) == 3


def test_where_an_episode_gave_several_samples_group_filtering_measures_spread_over_episodes():
    # group 0: episode a (1.0, seven samples) and b (0.0); group 1: c (1.0) and d (0.0). Over episodes the two
    # spread alike and both are kept; counted per sample group 0 (seven 1s, one 0) would spread less and go
    many = _episodes(_scored([1.0] * 7 + [0.0, 1.0, 0.0], [0] * 8 + [1, 1]), ["a"] * 7 + ["b", "c", "d"])
    kept = filter_groups(many, 0.5, UpdateBatchShape(1, 2, 1), {})[0]
    assert kept[keys.GROUP_IDS].tolist() == [0] * 8 + [1, 1]
