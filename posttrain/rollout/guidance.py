"""Guidance from the data's own answer (``algorithm.guidance``): a training group none of whose answers is
right gets the row's reference answer as its last sample, scored like any answer (LUFFY-style off-policy
guidance, on the groups on-policy sampling cannot learn from).

    scored group, n answers, no accuracy above 0
        → its last answer replaced by the tokens of ``extra_info.reference_answer`` (``agent_turn_ids``:
          the text, then eos, as an SFT transcript's assistant turn is laid out), GUIDED true on that row
        → the rollout scores the rebuilt batch again (the reference is judged, not assumed right)

Why: under group advantages a group whose answers all score alike teaches nothing (dynamic sampling drops
it); with a right answer among them the reference is pushed up and the wrong answers down. The reference's
tokens are learnt as if sampled: the update's π_old is the trainer's own (one update a step: π_θ
detached; several: the old-logprob pass), so its loss is the advantage times ∇log π of each token, an SFT
step on the reference scaled by its advantage, clipped like any sample's from the second update on. LUFFY's
ratio toward the expert (π_θ / 1, reshaped by x / (x + γ)) is not used: ∇log π already gives a
low-probability token its full gradient, which is what that reshaping is for.

A guided row's BEHAVIOUR_LOGPROBS are 0 (no engine sampled it), so importance weights toward the
behaviour policy are meaningless there: the config check refuses guidance where they weight the loss
(asynchronous runs), and ``rollout/logprob_gap`` leaves guided rows out. A row whose reference is missing,
empty or longer than ``max_response_length`` is not guided (counted). Where the answer's accuracy is not
reported it is ``score > 0`` (``sample_accuracy``). The rollout's ``reward/*`` metrics (scored before
guidance), the step's ``critic/score/*`` and a curriculum's accuracy describe the policy's own answers only.

Metrics per rollout round: ``guidance/groups`` (groups given their reference) and ``guidance/unguided``
(groups with no right answer whose row has no usable reference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from posttrain import keys
from posttrain.agents.transcript import agent_turn_ids
from posttrain.data.format import REFERENCE_ANSWER
from posttrain.metrics import Metrics, total
from posttrain.protocol import Batch
from posttrain.rollout.batching import group_ids_of, pad_prompt_side, prompt_token_lists, sample_accuracy, sequences_to_batch

REFERENCE_KEY = REFERENCE_ANSWER  # extra_info's field: the text of a right answer (a preparer writes it)


def reference_answer(extra_info: Mapping[str, Any] | None) -> str | None:
    """The row's reference answer text, or None where it has none (missing, not text, or empty)."""
    text = (extra_info or {}).get(REFERENCE_KEY)
    return text if isinstance(text, str) and text.strip() else None


class Guidance:
    """Which samples of a scored training batch become their row's reference answer, and the rebuilt responses."""

    def __init__(self, tokenizer: Any, max_response_length: int, pad_token_id: int) -> None:
        self.tokenizer, self.max_response_length, self.pad_token_id = tokenizer, max_response_length, pad_token_id

    def choose(self, scored: Batch) -> tuple[dict[int, list[int]], Metrics]:
        """Row → the reference's tokens, for the last row of each group (rows sharing a UID) with no right answer
        and a usable reference; with the metrics (module docstring)."""
        accuracy = sample_accuracy(scored)
        groups = group_ids_of(scored[keys.UID]).numpy()
        chosen: dict[int, list[int]] = {}
        unguided = 0
        for group in np.unique(groups):
            rows = np.flatnonzero(groups == group)
            if len(rows) < 2 or accuracy[rows].max() > 0:
                continue
            last = int(rows[-1])
            text = reference_answer(scored[keys.EXTRA_INFO][last])
            tokens = agent_turn_ids(self.tokenizer, text) if text is not None else None
            if tokens is None or len(tokens) > self.max_response_length:
                unguided += 1
                continue
            chosen[last] = tokens
        return chosen, {"guidance/groups": total(len(chosen)), "guidance/unguided": total(unguided)}

    def rebuild(self, responses: Batch, chosen: Mapping[int, list[int]]) -> Batch:
        """``responses`` (``responses_to_batch``'s columns for the whole batch) with the ``chosen`` rows' responses
        replaced by their tokens (behaviour logprobs 0, finish reason ``stop``), and GUIDED (B,) on every row."""
        out = responses.copy()
        guided = torch.zeros(len(responses), dtype=torch.bool)
        if chosen:
            rows = sorted(chosen)
            tokens = [chosen[row] for row in rows]
            fresh = sequences_to_batch(prompt_token_lists(responses.index(rows)), tokens, pad_token_id=self.pad_token_id,
                                       response_width=responses[keys.RESPONSE_IDS].shape[1], logprobs=[[0.0] * len(t) for t in tokens])
            index = torch.tensor(rows, dtype=torch.long)
            for key, value in pad_prompt_side(fresh, responses[keys.PROMPT_IDS].shape[1], self.pad_token_id).items():
                out.tensors[key][index] = value.to(out.tensors[key].dtype)
            finish = np.array(out.non_tensors[keys.FINISH_REASON], dtype=object)
            finish[rows] = "stop"
            out.non_tensors[keys.FINISH_REASON] = finish
            guided[index] = True
        out.tensors[keys.GUIDED] = guided
        return out
