"""The reward-model worker puts the classifier's sequence score, read at the attention mask's last real token, on each response's last token."""

import torch
from transformers import AutoModelForSequenceClassification

from posttrain import keys
from posttrain.config.schema import RewardModelConfig
from posttrain.controller import WorkerSpec, spawn_local
from posttrain.engines.training.inputs import build_model_inputs
from posttrain.models import cached_tiny_model
from posttrain.protocol import Batch
from posttrain.workers.reward_model import RewardModelWorker, last_real_positions


def test_scores_land_on_the_last_response_token_and_match_the_model(tmp_path):
    source = cached_tiny_model("llama")
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
    model.config.pad_token_id = 0
    model.save_pretrained(tmp_path / "rm")
    group = spawn_local({"rm": WorkerSpec(RewardModelWorker, (RewardModelConfig(enable=True, model_path=str(tmp_path / "rm")),))})["rm"]

    prompt_ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[11, 12, 0, 0], [13, 14, 15, 16]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    batch = Batch.from_dict(build_model_inputs(prompt_ids, prompt_mask, response_ids, response_mask) | {keys.RESPONSE_MASK: response_mask})

    scores = group.compute_rm_score(batch)[keys.TOKEN_SCORES]
    assert (scores[0, [0, 2, 3]] == 0).all() and (scores[1, :3] == 0).all()  # only the last response token is set
    with torch.no_grad():
        # The first row alone, without padding: the classifier's score of [5, 6, 11, 12].
        alone = model(input_ids=torch.tensor([[5, 6, 11, 12]])).logits[0, 0]
    assert torch.allclose(scores[0, 1], alone, atol=1e-4)
    assert scores[1, 3] != 0


def test_a_response_ending_in_eos_is_scored_at_its_eos_when_pad_is_eos(tmp_path):
    # SmolLM2's layout: pad == eos. Hugging Face's pad rule would take the eos for padding and score the token before it.
    source = cached_tiny_model("llama")
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1).eval()
    eos = model.config.eos_token_id
    assert model.config.pad_token_id == eos
    model.save_pretrained(tmp_path / "rm")
    group = spawn_local({"rm": WorkerSpec(RewardModelWorker, (RewardModelConfig(enable=True, model_path=str(tmp_path / "rm")),))})["rm"]

    prompt_ids = torch.tensor([[eos, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[11, 12, eos, eos], [13, 14, 15, eos]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # row 0: 11 12 eos, then one pad; row 1 ends in its eos
    batch = Batch.from_dict(build_model_inputs(prompt_ids, prompt_mask, response_ids, response_mask) | {keys.RESPONSE_MASK: response_mask})

    scores = group.compute_rm_score(batch)[keys.TOKEN_SCORES]
    assert (scores[0, [0, 1, 3]] == 0).all() and (scores[1, :3] == 0).all()
    model.config.pad_token_id = None  # one unpadded row: the classifier reads its very last token
    with torch.no_grad():
        at_eos = [model(input_ids=torch.tensor([ids])).logits[0, 0] for ids in ([5, 6, 11, 12, eos], [7, 8, 9, 13, 14, 15, eos])]
        before_eos = model(input_ids=torch.tensor([[5, 6, 11, 12]])).logits[0, 0]
    assert torch.allclose(scores[0, 2], at_eos[0], atol=1e-4) and torch.allclose(scores[1, 3], at_eos[1], atol=1e-4)
    assert not torch.allclose(scores[0, 2], before_eos, atol=1e-3)  # what the pad rule would have scored


def test_last_real_positions_by_hand():
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1]])
    assert last_real_positions(mask).tolist() == [3, 5, 2, 5]
