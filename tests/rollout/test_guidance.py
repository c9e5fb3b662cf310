"""Guidance from the data's reference answers (rollout/guidance.py) through a real SingleTurnRollout: a group with no
right answer gets its reference as its last sample, laid out as if sampled and scored by the reward manager; a group
with a right answer, a row without a usable reference and a validation batch are left as sampled."""

import numpy as np
import pytest
import torch

from posttrain import keys
from posttrain.data.format import REFERENCE_ANSWER
from posttrain.errors import InputError
from posttrain.protocol import Batch
from posttrain.rewards.manager import RewardManager
from posttrain.rollout import SingleTurnRollout
from posttrain.rollout.guidance import Guidance
from posttrain.trainer.data_setup import CurriculumTracker
from posttrain.trainer.learn import rollout_logprob_gap

EOS, PAD = 1, 0
WIDTH = 8  # max_response_length


class Tokenizer:
    """Token n is chr(n) (EOS and PAD are special), so a test writes tokens as text."""

    eos_token_id, pad_token_id = EOS, PAD

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def batch_decode(self, sequences, skip_special_tokens=False):
        return ["".join(chr(t) for t in seq if not (skip_special_tokens and t in (EOS, PAD))) for seq in sequences]


SCORED: list[str] = []  # every answer the score function was asked about, in order


def exact(solution_str, ground_truth):
    SCORED.append(solution_str)
    return float(solution_str == ground_truth)


class Actor:
    """Samples the given answers (each a text, eos after it), with logprob -0.5 per token."""

    def __init__(self, answers):
        self.answers = answers

    def generate(self, batch):
        tokens = [[ord(c) for c in text] + [EOS] for text in self.answers]
        return Batch.from_dict(non_tensors={keys.TURN_TOKEN_IDS: tokens, keys.TURN_LOGPROBS: [[-0.5] * len(t) for t in tokens],
                                            keys.FINISH_REASON: ["stop"] * len(tokens)})


class Roles:
    reward_model = None

    def __init__(self, answers):
        self.actor = Actor(answers)


def prompts(references, prompt_lengths=(3, 2, 4)):
    """One group of three samples per reference (None: the row has none); the prompts differ in length, so
    their left padding does; the right answer of group g is the text 'ok<g>'."""
    rows = []
    for group, reference in enumerate(references):
        length = prompt_lengths[group % len(prompt_lengths)]
        info = {} if reference is None else {REFERENCE_ANSWER: reference}
        rows += [(list(range(10 + group, 10 + group + length)), f"p{group}", f"ok{group}", info)] * 3
    width = max(len(r[0]) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r[0])) + r[0] for r in rows])
    mask = torch.tensor([[0] * (width - len(r[0])) + [1] * len(r[0]) for r in rows])
    return Batch.from_dict({keys.PROMPT_IDS: ids, keys.PROMPT_MASK: mask},
                           {keys.UID: [r[1] for r in rows], keys.GROUND_TRUTH: [r[2] for r in rows],
                            keys.DATA_SOURCE: ["x"] * len(rows), keys.EXTRA_INFO: [r[3] for r in rows]})


def rollout():
    tokenizer = Tokenizer()
    return SingleTurnRollout(RewardManager(tokenizer, score_function=exact, timeout_s=None), WIDTH, PAD,
                             guidance=Guidance(tokenizer, WIDTH))


def rows_as_text(batch):
    return Tokenizer().batch_decode([ids[mask.bool()].tolist() for ids, mask in zip(batch[keys.RESPONSE_IDS], batch[keys.RESPONSE_MASK])])


def test_a_group_with_no_right_answer_gets_its_reference_as_its_last_sample_scored_and_laid_out_as_if_sampled():
    # group 0: none right, its reference right; group 1: one right; group 2: none right, no reference
    answers = ["no", "nah", "nope", "ok1", "x", "y", "a", "b", "c"]
    SCORED.clear()
    batch, metrics = rollout()(Roles(answers), prompts(["ok0", "ok1", None]), whole_batch=False)
    assert SCORED == answers + ["ok0"]  # the sampled answers, then the reference alone
    assert rows_as_text(batch) == ["no\x01", "nah\x01", "ok0\x01", "ok1\x01", "x\x01", "y\x01", "a\x01", "b\x01", "c\x01"]
    assert batch[keys.GUIDED].tolist() == [False, False, True] + [False] * 6
    assert batch[keys.TOKEN_SCORES].sum(-1).tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0]  # the reference judged, right
    assert metrics["guidance/groups"].value == 1 and metrics["guidance/unguided"].value == 1
    assert metrics["guidance/reference_wrong"].value == 0
    assert metrics["reward/samples"].value == 9
    # the policy's own answers in the rollout's metrics: one right of nine, not two
    assert batch[keys.BEHAVIOUR_LOGPROBS][2].tolist() == [0.0] * WIDTH  # no engine sampled it
    assert batch[keys.BEHAVIOUR_LOGPROBS][1].tolist()[:4] == [-0.5] * 4 and batch[keys.BEHAVIOUR_LOGPROBS][1].tolist()[4:] == [0.0] * 4
    # the whole row is rebuilt: prompt then reference, positions counting real tokens, masks over them
    same_prompt = batch.index([1, 2])
    assert torch.equal(same_prompt[keys.PROMPT_IDS][0], same_prompt[keys.PROMPT_IDS][1])
    prompt_width = batch[keys.PROMPT_IDS].shape[1]
    guided = batch.index([2])
    real = guided[keys.ATTENTION_MASK][0].bool()
    assert guided[keys.INPUT_IDS][0][real].tolist() == [10, 11, 12] + [ord(c) for c in "ok0"] + [EOS]
    assert guided[keys.POSITION_IDS][0][real].tolist() == list(range(7))
    assert guided[keys.INPUT_IDS][0][prompt_width:].tolist() == guided[keys.RESPONSE_IDS][0].tolist()
    assert batch.non_tensors[keys.FINISH_REASON].tolist() == ["stop"] * 9


def test_a_reference_longer_than_a_response_may_be_is_not_given():
    batch, metrics = rollout()(Roles(["a", "b", "c"]), prompts(["x" * WIDTH]), whole_batch=False)  # with eos: WIDTH + 1 tokens
    assert not batch[keys.GUIDED].any() and metrics["guidance/unguided"].value == 1 and metrics["guidance/groups"].value == 0


def test_a_reference_the_reward_does_not_accept_is_counted_and_its_group_still_ties():
    batch, metrics = rollout()(Roles(["a", "b", "c"]), prompts(["not ok0"]), whole_batch=False)
    assert batch[keys.GUIDED].tolist() == [False, False, True] and rows_as_text(batch)[2] == "not ok0\x01"
    assert metrics["guidance/reference_wrong"].value == 1 and batch[keys.TOKEN_SCORES].sum().item() == 0


def test_validation_is_never_guided():
    batch, metrics = rollout()(Roles(["a", "b", "c"]), prompts(["ok0"]), validate=True)
    assert keys.GUIDED not in batch and "guidance/groups" not in metrics
    assert batch[keys.TOKEN_SCORES].sum().item() == 0


def test_a_batch_with_nothing_to_guide_still_says_so_in_guided():
    batch, metrics = rollout()(Roles(["ok0", "b", "c"]), prompts(["ok0"]), whole_batch=False)
    assert batch[keys.GUIDED].tolist() == [False] * 3 and metrics["guidance/groups"].value == 0
    assert rows_as_text(batch) == ["ok0\x01", "b\x01", "c\x01"]


def test_training_rows_with_no_reference_at_all_are_refused_before_any_worker_starts():
    class Dataset:
        samples = [type("Sample", (), {"extra_info": {}})(), type("Sample", (), {"extra_info": {REFERENCE_ANSWER: " "}})()]

    with pytest.raises(InputError, match="none of the 2 training rows has extra_info.reference_answer"):
        rollout().check_data(training=Dataset())
    Dataset.samples[1].extra_info = {REFERENCE_ANSWER: "ok"}
    rollout().check_data(training=Dataset())  # one is enough


def test_guided_rows_are_left_out_of_the_logprob_gap_and_of_the_curriculum_s_accuracy():
    batch, _ = rollout()(Roles(["no", "nah", "nope"]), prompts(["ok0"]), whole_batch=False)
    old = batch[keys.BEHAVIOUR_LOGPROBS].clone()
    old[2] = -3.0  # the trainer's logprob of the reference: far from the 0 written for it
    gap = rollout_logprob_gap(batch.union(Batch.from_dict({keys.OLD_LOGPROBS: old})))
    assert gap["rollout/logprob_gap/max"].value == 0.0 and gap["rollout/logprob_gap"].count == 7  # the two sampled rows' tokens: 3 + 4

    class Sampler:
        def observe(self, rows, accuracy):
            self.seen = (rows, accuracy)
            return {}

    tracker = CurriculumTracker(Sampler())
    batch.non_tensors[keys.UID] = np.array(["train:0"] * 3, dtype=object)
    tracker.add(batch)
    tracker.step_done()
    assert tracker.sampler.seen[1] == [0.0, 0.0]  # the guided row's 1.0 is not the policy's
