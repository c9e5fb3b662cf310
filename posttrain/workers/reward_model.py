"""The reward-model worker: a sequence-classification model scores (prompt, response) pairs.

The score of the whole sequence (the classifier's logit at the last real token) goes on the last
response token, like a rule-based score, so the rest of the step treats both alike.

The last real token is the attention mask's right-most 1. Hugging Face's sequence classifiers find
it by the pad rule instead (the right-most token that is not the pad token), which skips a final
eos when pad == eos (SmolLM2, many Llama tokenizers) and scores the token before it; so the worker
runs the classifier's backbone and applies its ``score`` head itself, at the masked position. That
head is what decoder reward models (``*ForSequenceClassification`` of Llama, Qwen2, Mistral, ...) have.
"""

from __future__ import annotations

import torch

from posttrain import keys
from posttrain.config.schema import RewardModelConfig
from posttrain.controller import Dispatch, Worker, WorkerContext, register
from posttrain.errors import InputError
from posttrain.models import resolve_model
from posttrain.protocol import Batch


class RewardModelWorker(Worker):
    def __init__(self, ctx: WorkerContext, config: RewardModelConfig) -> None:
        super().__init__(ctx)
        from transformers import AutoModelForSequenceClassification

        if not config.model_path:
            raise InputError("reward_model.enable=true needs reward_model.model_path: a sequence-classification model directory")
        path = resolve_model(config.model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).eval()
        if not isinstance(getattr(self.model, "score", None), torch.nn.Module):
            raise InputError(
                f"reward model {config.model_path} is a {type(self.model).__name__}, which has no `score` head on the last "
                "token; reward_model.model_path must be a decoder sequence classifier (e.g. LlamaForSequenceClassification, "
                "Qwen2ForSequenceClassification)"
            )
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
        hidden = self.model.base_model(
            input_ids=piece[keys.INPUT_IDS], attention_mask=attention, position_ids=piece[keys.POSITION_IDS]
        ).last_hidden_state
        last = last_real_positions(attention)
        return self.model.score(hidden[torch.arange(hidden.shape[0]), last])[:, 0].float()


def last_real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) 0/1 → (B,) int64: the index of each row's right-most 1 (0 for a row of zeros)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * (attention_mask > 0)).argmax(-1)
