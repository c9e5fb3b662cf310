"""A single-turn rollout's batch: env.reward_norm on its rows' rewards, as on episodes'; the engine's logprobs for every response token."""

import pytest
import torch

from posttrain import keys
from posttrain.protocol import Batch
from posttrain.rewards.manager import RewardManager
from posttrain.rollout import SingleTurnRollout
from posttrain.rollout.batching import responses_to_batch
from tests.rewards.helpers import CharTokenizer, response_batch

NO_REWARD_MODEL = type("Roles", (), {"reward_model": None})()


def by_length(solution_str, ground_truth):
    return float(len(solution_str))


def scored(norm: str) -> tuple[Batch, Batch]:
    """Four responses of 1-4 characters (scores 1-4), each with a response mask of its own length, in two groups."""
    texts = ["a", "bb", "ccc", "dddd"]
    masks = [[1] * len(t) + [0] * (5 - len(t)) for t in texts]
    rollout = SingleTurnRollout(RewardManager(CharTokenizer(), score_function=by_length, timeout_s=None), 8, 0, reward_norm=norm)
    batch, _ = rollout.score(NO_REWARD_MODEL, response_batch(texts, masks, ["x"] * 4, ["-"] * 4))
    batch = batch.union(Batch.from_dict({keys.GROUP_IDS: torch.tensor([0, 0, 1, 1])}))
    return batch, rollout.finish_batch(batch, {})[0]


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_single_turn_rewards_are_normalised_over_the_batch_or_group_on_each_response_s_last_token(norm):
    raw, finished = scored(norm)
    before = raw[keys.TOKEN_SCORES].sum(-1)
    assert before.tolist() == [1.0, 2.0, 3.0, 4.0]
    after = finished[keys.TOKEN_SCORES]
    if norm == "batch":
        expected = (before - before.mean()) / (before.std() + 1e-6)
    else:  # within each group of two, (x - its mean) / its std: the std of (1, 2) and of (3, 4) alike
        expected = torch.tensor([-0.5, 0.5, -0.5, 0.5]) / torch.tensor([1.0, 2.0]).std()
    assert after.sum(-1) == pytest.approx(expected.tolist(), abs=1e-5)
    last = [len(t) - 1 for t in ("a", "bb", "ccc", "dddd")]
    assert [int(row.nonzero().max()) for row in after] == last  # still on the response's last token


def test_without_normalisation_the_rewards_stay_raw():
    raw, finished = scored("none")
    assert torch.equal(raw[keys.TOKEN_SCORES], finished[keys.TOKEN_SCORES])


@pytest.mark.parametrize("logprobs", [None, [-0.5]], ids=["none", "one short"])
def test_a_response_without_its_engine_logprobs_is_refused_not_padded_with_zeros(logprobs):
    """A behaviour logprob of 0 is probability 1: a padded row would weigh its tokens as if the engine were sure of them."""
    prompts = Batch.from_dict({keys.PROMPT_IDS: torch.tensor([[5, 6], [5, 6]]), keys.PROMPT_MASK: torch.ones(2, 2, dtype=torch.long)})
    sampled = Batch.from_dict(non_tensors={keys.TURN_TOKEN_IDS: [[1, 2], [3, 4]], keys.TURN_LOGPROBS: [[-0.1, -0.2], logprobs],
                                           keys.FINISH_REASON: ["stop", "stop"]})
    with pytest.raises(ValueError, match="response 1: the rollout engine returned .* logprobs for 2 tokens"):
        responses_to_batch(prompts, sampled, max_response_length=4, pad_token_id=0)
    sampled.non_tensors[keys.TURN_LOGPROBS][1] = [-0.3, -0.4]
    batch = responses_to_batch(prompts, sampled, max_response_length=4, pad_token_id=0)
    assert torch.allclose(batch[keys.BEHAVIOUR_LOGPROBS], torch.tensor([[-0.1, -0.2, 0, 0], [-0.3, -0.4, 0, 0]]))
