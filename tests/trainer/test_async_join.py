"""Joining a batch's units on the trainer: groups are numbered across the whole batch (not per unit),
prompts padded to different widths are re-padded without changing any token, and per-unit metrics
merge as max / min / mean by their name."""

import torch

from posttrain import keys
from posttrain.algos import get_advantage_estimator
from posttrain.algos.advantages import AdvantageInputs
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.protocol import Batch, pad_rows
from posttrain.metrics import maximum, mean, merge, minimum, total, values
from posttrain.rollout.batching import join_rollouts
from posttrain.rollout.batching import group_ids_of, repeat_for_groups

PAD = 0


def unit(uids: list[str], prompt_lengths: list[int], width: int, n: int = 2, seed: int = 0) -> Batch:
    """A unit as a generator returns it: prompts left-padded to ``width``, responses, scores."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 50, (length,), generator=generator).tolist() for length in prompt_lengths]
    batch = Batch.from_dict({keys.PROMPT_IDS: pad_rows(prompts, width, PAD, left=True),
                             keys.PROMPT_MASK: pad_rows([[1] * len(p) for p in prompts], width, left=True)},
                            {keys.UID: uids})
    repeated = repeat_for_groups(batch, n)
    responses = [torch.randint(1, 50, (3 + i % 2,), generator=generator).tolist() for i in range(len(repeated))]
    response_ids, response_mask = pad_rows(responses, 5, PAD), pad_rows([[1] * len(r) for r in responses], 5)
    inputs = build_model_inputs(repeated[keys.PROMPT_IDS], repeated[keys.PROMPT_MASK], response_ids, response_mask)
    scores = torch.zeros(len(repeated), 5)
    scores[:, 0] = torch.rand(len(repeated), generator=generator)
    return repeated.union(Batch.from_dict(inputs | {keys.RESPONSE_MASK: response_mask, keys.TOKEN_SCORES: scores}))


def test_groups_are_numbered_across_units_so_advantages_match_one_whole_batch():
    first, second = unit(["a", "b"], [3, 4], 4, seed=1), unit(["c", "d"], [2, 4], 4, seed=2)
    joined = join_rollouts([first, second], PAD)
    assert first[keys.GROUP_IDS].tolist() == second[keys.GROUP_IDS].tolist() == [0, 0, 1, 1]  # each unit from 0
    group_ids = group_ids_of(joined[keys.UID])
    assert group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    grpo = get_advantage_estimator("grpo")
    whole = grpo(AdvantageInputs(joined[keys.TOKEN_SCORES], joined[keys.RESPONSE_MASK], group_ids)).advantages
    per_unit = torch.cat([grpo(AdvantageInputs(u[keys.TOKEN_SCORES], u[keys.RESPONSE_MASK], u[keys.GROUP_IDS])).advantages
                          for u in (first, second)])
    torch.testing.assert_close(whole, per_unit)  # groups never span units, so per-unit GRPO is the same...
    merged_wrongly = grpo(AdvantageInputs(joined[keys.TOKEN_SCORES], joined[keys.RESPONSE_MASK], joined[keys.GROUP_IDS])).advantages
    assert not torch.allclose(merged_wrongly, whole)  # ...but the units' own ids would merge groups a and c


def test_units_with_different_prompt_widths_join_without_changing_a_token():
    narrow, wide = unit(["a"], [2], 2, seed=3), unit(["b"], [6], 6, seed=4)
    joined = join_rollouts([narrow, wide], PAD)
    assert joined[keys.PROMPT_IDS].shape[1] == 6 and joined[keys.INPUT_IDS].shape[1] == 6 + 5
    for row, source in ((0, narrow), (2, wide)):
        real = joined[keys.ATTENTION_MASK][row].bool()
        original = source[keys.INPUT_IDS][row % 2][source[keys.ATTENTION_MASK][row % 2].bool()]
        assert joined[keys.INPUT_IDS][row][real].tolist() == original.tolist()
        assert joined[keys.POSITION_IDS][row][real].tolist() == list(range(int(real.sum())))
    torch.testing.assert_close(joined[keys.RESPONSE_MASK], torch.cat([narrow[keys.RESPONSE_MASK], wide[keys.RESPONSE_MASK]]))


def test_unit_metrics_merge_by_kind():
    # units of 2 and 6 episodes: the mean weighs by episodes, the episodes add up
    merged = merge([{"num_turns/max": maximum(2), "num_turns/min": minimum(1), "num_turns/mean": mean(1.5, 2), "agent/episodes": total(2)},
                    {"num_turns/max": maximum(3), "num_turns/min": minimum(2), "num_turns/mean": mean(2.5, 6), "agent/episodes": total(6),
                     "env/searches": total(6)}])  # a counter: the unit's 6 searches
    assert values(merged) == {"num_turns/max": 3.0, "num_turns/min": 1.0, "num_turns/mean": (1.5 * 2 + 2.5 * 6) / 8,
                              "agent/episodes": 8.0, "env/searches": 6.0}  # the unit without it adds none


def test_a_unit_where_no_sample_was_scored_joins_with_its_score_extras_missing():
    """A unit whose answers were all unreadable has no reward_extra/acc (the score function never ran):
    the join gives it a gap there (None: accuracy then falls back to the score) instead of refusing the batch."""
    import numpy as np

    scored, unscored = unit(["a", "b"], [3, 4], 4, seed=1), unit(["c", "d"], [2, 4], 4, seed=2)
    scored = scored.union(Batch.from_dict(non_tensors={"reward_extra/acc": np.array([1.0, 0.0, 1.0, 1.0])}))
    joined = join_rollouts([scored, unscored], PAD)
    acc = joined["reward_extra/acc"]  # an object column (a score function's extras may be anything): None where missing
    assert acc[:4].tolist() == [1.0, 0.0, 1.0, 1.0] and acc[4:].tolist() == [None] * 4
