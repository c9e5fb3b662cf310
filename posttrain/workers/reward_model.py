"""The reward-model worker: a sequence-classification model scores (prompt, response) pairs.

The score of the whole sequence (the classifier's logit at the last real token) goes on the last
response token, like a rule-based score, so the rest of the step treats both alike.
"""

from __future__ import annotations

import torch

from posttrain import keys
from posttrain.config.schema import RewardModelConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.models import resolve_model
from posttrain.protocol import Batch


class RewardModelWorker(Worker):
    def __init__(self, ctx: WorkerContext, config: RewardModelConfig) -> None:
        super().__init__(ctx)
        from transformers import AutoModelForSequenceClassification

        if not config.model_path:
            raise ValueError("reward_model.enable=true needs reward_model.model_path: a sequence-classification model directory")
        path = resolve_model(config.model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).eval()
        self.micro_batch_size = config.micro_batch_size_per_gpu

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, borrow_inputs=True)
    @torch.no_grad()
    def compute_rm_score(self, batch: Batch) -> Batch:
        scores = torch.cat([self._score(piece) for piece in batch.split(self.micro_batch_size)])
        response_mask = batch[keys.RESPONSE_MASK]
        last = (response_mask.cumsum(-1) == response_mask.sum(-1, keepdim=True)) & (response_mask > 0)
        token_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
        token_scores[last] = scores[last.any(-1)]
        return Batch.from_dict({keys.TOKEN_SCORES: token_scores})

    def _score(self, piece: Batch) -> torch.Tensor:
        attention = piece[keys.ATTENTION_MASK]
        # Right-most real token of each row: the classifier reads its hidden state there.
        logits = self.model(input_ids=piece[keys.INPUT_IDS], attention_mask=attention, position_ids=piece[keys.POSITION_IDS]).logits
        return logits[:, 0].float()
