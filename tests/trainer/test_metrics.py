import torch

from posttrain import keys
from posttrain.protocol import Batch
from posttrain.trainer.metrics import data_metrics, timing_metrics


def batch() -> Batch:
    # two samples: response lengths 3 and 1 (max 3), prompt lengths 2 and 4
    return Batch.from_dict({
        keys.RESPONSE_MASK: torch.tensor([[1, 1, 1], [1, 0, 0]]),
        keys.PROMPT_MASK: torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
        keys.TOKEN_SCORES: torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]),
        keys.ADVANTAGES: torch.tensor([[1.0, 2.0, 3.0], [-4.0, 99.0, 99.0]]),  # 99 sits under the mask
    })


def test_data_metrics_by_hand():
    m = data_metrics(batch(), max_response_length=3)
    assert m["critic/score/mean"] == 0.75 and m["critic/score/max"] == 1.0 and m["critic/score/min"] == 0.5
    assert m["critic/advantages/mean"] == 0.5  # (1 + 2 + 3 - 4) / 4: masked entries ignored
    assert m["critic/advantages/max"] == 3.0 and m["critic/advantages/min"] == -4.0
    assert m["response_length/mean"] == 2.0 and m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == 3.0
    assert "critic/values/mean" not in m


def test_the_share_of_groups_whose_samples_all_scored_the_same():
    # three prompts of two samples: (1, 1) all right, (0, 1) varied, (0, 0) all wrong
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    groups = Batch.from_dict({
        keys.RESPONSE_MASK: torch.ones(6, 1), keys.TOKEN_SCORES: scores[:, None],
        keys.GROUP_IDS: torch.tensor([0, 0, 1, 1, 2, 2]),
    })
    assert data_metrics(groups, max_response_length=1)["critic/score/uniform_groups"] == 2 / 3
    assert "critic/score/uniform_groups" not in data_metrics(batch(), max_response_length=3)  # no groups: not said
    ones = Batch.from_dict({keys.RESPONSE_MASK: torch.ones(2, 1), keys.TOKEN_SCORES: torch.tensor([[0.0], [1.0]]),
                            keys.GROUP_IDS: torch.tensor([0, 1])})
    assert "critic/score/uniform_groups" not in data_metrics(ones, max_response_length=1)  # groups of one sample (PPO): not said


def test_timing_metrics_by_hand():
    m = timing_metrics({"gen": 2.0, "update_actor": 5.0, "step": 10.0}, batch())
    # 4 response tokens, 6 prompt tokens -> 10 tokens
    assert m["timing_per_token_ms/gen"] == 500.0
    assert m["timing_per_token_ms/update_actor"] == 500.0
    assert m["perf/total_num_tokens"] == 10 and m["perf/throughput"] == 1.0 and m["timing_s/step"] == 10.0


def test_validation_metrics_mean_best_and_majority_by_hand():
    import numpy as np

    from posttrain.trainer.validation import validation_metrics

    # prompt a: samples right, wrong, right (preds 4, 5, 4); prompt b: wrong, wrong, right (preds 1, 1, 2)
    acc = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    batch = Batch.from_dict(
        {keys.TOKEN_SCORES: torch.tensor(acc)[:, None]},
        {keys.DATA_SOURCE: ["arith"] * 6, keys.UID: ["a"] * 3 + ["b"] * 3,
         "reward_extra/acc": np.array(acc), "reward_extra/pred": np.array(["4", "5", "4", "1", "1", "2"], dtype=object)},
    )
    m = validation_metrics(batch, n=3)
    assert m["val/arith/acc/mean@3"] == 0.5  # (2/3 + 1/3) / 2
    assert m["val/arith/acc/best@3"] == 1.0
    assert m["val/arith/acc/maj@3"] == 0.5  # a's majority (4) is right, b's (1) is wrong
    from posttrain.trainer.intervals import wilson

    # 95 % intervals: mean@3 over the 6 samples (3 right), best@3 over the 2 prompts (both right)
    assert (m["val/arith/acc_low/mean@3"], m["val/arith/acc_high/mean@3"]) == wilson(3, 6)
    assert (m["val/arith/acc_low/best@3"], m["val/arith/acc_high/best@3"]) == wilson(2, 2)
    assert (m["val/arith/acc_low/maj@3"], m["val/arith/acc_high/maj@3"]) == wilson(1, 2)


def test_majority_ignores_samples_without_an_answer_and_is_zero_when_none_has_one():
    import warnings

    import numpy as np

    from posttrain.trainer.validation import validation_metrics

    # prompt a: no answer, no answer, "4" (right) -> the one answer wins; prompt b: no answer at all -> 0
    acc = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    batch = Batch.from_dict(
        {keys.TOKEN_SCORES: torch.tensor(acc)[:, None]},
        {keys.DATA_SOURCE: ["arith"] * 6, keys.UID: ["a"] * 3 + ["b"] * 3,
         "reward_extra/acc": np.array(acc), "reward_extra/pred": np.array([np.nan, np.nan, 4.0, np.nan, np.nan, np.nan])},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice"
        m = validation_metrics(batch, n=3)
    assert m["val/arith/acc/maj@3"] == 0.5  # (1 + 0) / 2
