"""Guidance from the data's own answer (``algorithm.guidance``): a training group none of whose answers is
right gets the row's reference answer as its last sample, scored like any answer (LUFFY-style off-policy
guidance, on the groups on-policy sampling cannot learn from).

    scored group, n answers, no accuracy above 0
        → its last answer replaced by the tokens of ``extra_info.reference_answer`` (``agent_turn_ids``:
          the text, then eos, as an SFT transcript's assistant turn is laid out), GUIDED true on that row
        → the rollout rebuilds the batch from the tokens and scores the replaced rows again: the reference is
          judged by the run's own reward, not assumed right

Why: under group advantages a group whose answers all score alike teaches nothing (dynamic sampling drops
it); with a right answer among them the reference is pushed up and the wrong answers down. The reference's
tokens are learnt as if sampled: π_old is the trainer's own (sync mode: the old-logprob pass, or the
update's own forward detached), so on the first optimizer step the loss is the advantage times ∇log π of
each token, an SFT step on the reference scaled by its advantage; from a second step on (several
mini-batches or PPO epochs) its ratio is clipped like any sample's. LUFFY's ratio toward the expert
(π_θ / 1, reshaped by x / (x + γ)) and its dropped clip are not used: ∇log π already gives an unlikely
token its full gradient, which is what that reshaping is for.

A guided row's BEHAVIOUR_LOGPROBS are 0 (no engine sampled it), so importance weights toward the behaviour
policy mean nothing there: the config check refuses guidance in asynchronous runs, and ``rollout/logprob_gap``
leaves guided rows out. A row whose reference is missing, empty or longer than ``max_response_length`` is not
guided (counted). Where the answer's accuracy is not reported it is ``score > 0`` (``sample_accuracy``; with a
reward model, the rule's score and the model's together). The rollout's ``reward/*`` metrics (scored before
guidance), the step's ``critic/score/*`` (but ``uniform_groups``, which is of the groups trained on) and a
curriculum's accuracy describe the policy's own answers only.

Metrics per rollout round, summed over a step's rounds: ``guidance/groups`` (groups given their reference),
``guidance/unguided`` (groups with no right answer whose row has no usable reference) and
``guidance/reference_wrong`` (references the reward did not score right: their group still ties).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from posttrain import keys
from posttrain.agents.transcript import agent_turn_ids
from posttrain.data.format import REFERENCE_ANSWER
from posttrain.errors import InputError
from posttrain.metrics import Metrics, total
from posttrain.protocol import Batch
from posttrain.rollout.batching import group_ids_of, sample_accuracy


def reference_answer(extra_info: Mapping[str, Any] | None) -> str | None:
    """The row's reference answer text, or None where it has none (missing, not text, or empty)."""
    text = (extra_info or {}).get(REFERENCE_ANSWER)
    return text if isinstance(text, str) and text.strip() else None


def check_references(samples: list[Any]) -> None:
    """Guidance with training rows of which none has a reference answer would change nothing: refused before
    any worker starts. Some rows without one are allowed (no right answer to give: not guided, counted)."""
    if samples and not any(reference_answer(sample.extra_info) for sample in samples):
        raise InputError(f"algorithm.guidance.enable: none of the {len(samples)} training rows has extra_info.{REFERENCE_ANSWER} "
                         "(the text of a right answer) to give a group with no right answer; put it in your data.train_files' rows "
                         "(the built-in bfcl and arithmetic preparers write it), or turn guidance off")


class Guidance:
    """Which samples of a scored training batch become their row's reference answer, and those samples' tokens."""

    def __init__(self, tokenizer: Any, max_response_length: int) -> None:
        self.tokenizer, self.max_response_length = tokenizer, max_response_length

    def choose(self, scored: Batch) -> tuple[dict[int, list[int]], Metrics]:
        """Row → the reference's tokens, for the last row of each group (rows sharing a UID) with no right answer
        and a usable reference; with ``guidance/groups`` and ``guidance/unguided``."""
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

    @staticmethod
    def substitute(sampled: Batch, chosen: Mapping[int, list[int]]) -> Batch:
        """What ``actor.generate`` returned, with the ``chosen`` rows' tokens in place of the sampled ones (behaviour
        logprobs 0, finish reason ``stop``): ``responses_to_batch`` lays them out like any response."""
        columns = {key: list(sampled.non_tensors[key]) for key in (keys.TURN_TOKEN_IDS, keys.TURN_LOGPROBS, keys.FINISH_REASON)}
        for row, tokens in chosen.items():
            columns[keys.TURN_TOKEN_IDS][row], columns[keys.TURN_LOGPROBS][row] = list(tokens), [0.0] * len(tokens)
            columns[keys.FINISH_REASON][row] = "stop"
        return Batch(dict(sampled.tensors), dict(sampled.non_tensors) | columns, dict(sampled.meta))


def reference_wrong(scored: Batch) -> Metrics:
    """``guidance/reference_wrong``: of the scored references, those the reward did not accept."""
    return {"guidance/reference_wrong": total(int((sample_accuracy(scored) <= 0).sum()))}
