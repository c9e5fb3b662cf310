"""Single-turn rollouts: one response per prompt row, scored by the reward manager (and reward model).

    actor.generate (token lists) → sequences_to_batch → reward manager on each response's last
    token (+ reward model scores) → with ``algorithm.guidance``, in training, a group with no right
    answer given its row's reference answer as its last sample, and the batch scored again (rollout/guidance.py)

Where the calls are the answer (``env.options.answer: calls``, rollout/calls.py), each response is
read into its calls first, and those go to the reward manager as the answer.

A prompt the reward manager's table cannot score is refused before any worker starts
(:meth:`SingleTurnRollout.check_data`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from posttrain import keys
from posttrain.agents.env import EpisodeSample
from posttrain.data import DataFormatError, RLDataset, RowProblem, problems_report
from posttrain.errors import InputError
from posttrain.metrics import Metrics
from posttrain.protocol import Batch
from posttrain.rewards.manager import BatchRewardManager, RewardManager, RewardResult, decode_responses, place_answer_scores
from posttrain.rewards.registry import GROUND_TRUTH_FIX, ScoreFunction, lacks_ground_truth, unknown_source_fix
from posttrain.rollout.batching import join_rollouts, responses_to_batch
from posttrain.rollout.calls import CallsAnswers, calls_metrics
from posttrain.rollout.groups import normalize_rewards
from posttrain.rollout.guidance import Guidance, check_references, reference_wrong
from posttrain.rollout.roles import RolloutRoles
from posttrain.rollout.scoring import open_judge
from posttrain.timing import timed
from posttrain.workers.sampling import VALIDATE_META_KEY


def validation_view(batch: Batch) -> Batch:
    """The same rows, to be sampled with the validation settings (``rollout.val_kwargs``)."""
    return Batch(batch.tensors, batch.non_tensors, batch.meta | {VALIDATE_META_KEY: True})


class SingleTurnRollout:
    """One response per row from ``actor.generate``, scored by the reward manager (+ reward model)."""

    def __init__(self, reward_manager: RewardManager | BatchRewardManager, max_response_length: int, pad_token_id: int,
                 calls: CallsAnswers | None = None, reward_norm: str = "none", max_new_tokens: int | None = None,
                 guidance: Guidance | None = None) -> None:
        """``calls``: the responses' calls are the answer (rollout/calls.py); ``reward_norm``: ``env.reward_norm``
        over the training batch (none, group, batch: rollout/groups.py ``normalize_rewards``); ``max_new_tokens``:
        a response's budget below ``max_response_length`` (a mixture's source's own, config/mixture.py); ``guidance``:
        ``algorithm.guidance``, training groups with no right answer given their row's reference (rollout/guidance.py)."""
        self.reward_manager, self.calls, self.reward_norm, self.guidance = reward_manager, calls, reward_norm, guidance
        self.max_new_tokens = max_new_tokens
        self._counts: list[dict[str, float]] = []  # each response's counters, of the last scoring (calls only)
        self.max_response_length, self.pad_token_id = max_response_length, pad_token_id
        self.first_failures: dict[str, str] = {}  # of the last rollout, by circuit breaker (trainer/breakers.py)
        self.stop_strings: tuple[str, ...] = ()  # a single turn ends on eos

    def check_data(self, **datasets: RLDataset | None) -> None:
        """Refuse, before any worker starts, a prompt the reward manager's table cannot score (its
        data source has no function, its ground truth is missing); a custom function takes any."""
        if self.reward_manager.score_function is None:
            check_scorable(self.reward_manager.score_functions, datasets.values())
        training = datasets.get("training")
        if self.guidance is not None and training is not None:
            check_references(training.samples)
        if self.calls is not None:
            for split, dataset in datasets.items():
                for index, sample in enumerate(dataset.samples if dataset is not None else ()):
                    try:
                        self.calls.check(EpisodeSample(list(sample.messages), sample.ground_truth, sample.data_source,
                                                       dict(sample.extra_info or {})))
                    except ValueError as error:
                        raise InputError(f"{split} prompt {index}: {error}") from None

    def open(self, roles: RolloutRoles) -> None:
        """The toolbox that reads the calls, where the calls are the answer, and the rubric's judge."""
        if self.calls is not None:
            self.calls.open()
        open_judge(self.reward_manager, roles)

    def before_training(self, samples: Iterable[EpisodeSample]) -> None:
        """Nothing to check before step 1: a reward function has no state to probe."""

    def close(self) -> None:
        """Stop the reward's scoring process (started again by the next scoring call, if any) and the toolbox."""
        self.reward_manager.close()
        if self.calls is not None:
            self.calls.close()

    def __call__(
        self, roles: RolloutRoles, batch: Batch, *, validate: bool = False, timings: dict[str, float] | None = None,
        whole_batch: bool = True,
    ) -> tuple[Batch, Metrics]:
        """Responses for ``batch``'s rows, scored; with ``whole_batch`` (a training batch), also what is decided
        across it (:meth:`finish_batch`)."""
        timings = {} if timings is None else timings
        with timed(timings, "gen"):
            request = validation_view(batch) if validate else batch
            if self.max_new_tokens is not None:
                request = Batch(request.tensors, request.non_tensors, request.meta | {keys.TURN_MAX_NEW_TOKENS: self.max_new_tokens})
            sampled = roles.actor.generate(request)
            responses = responses_to_batch(batch, sampled, max_response_length=self.max_response_length, pad_token_id=self.pad_token_id)
            if validate:
                responses.meta.clear()
        with timed(timings, "reward"):
            scored, metrics = self.score(roles, batch.union(responses))
            if self.guidance is not None and not validate:
                scored, guided = self._guide(roles, batch, sampled, scored)
                metrics |= guided  # reward/* stay the policy's own answers'
        if validate and self.calls is not None:  # each response's counters, in the episode records
            scored = scored.union(Batch.from_dict(non_tensors={keys.EPISODE_STATS: [dict(count) for count in self._counts]}))
        if validate or not whole_batch:
            return scored, metrics
        return self.finish_batch(scored, metrics)

    def _guide(self, roles: RolloutRoles, batch: Batch, sampled: Batch, scored: Batch) -> tuple[Batch, Metrics]:
        """``algorithm.guidance`` (rollout/guidance.py): the rows it chooses laid out from their reference's tokens
        and scored again, alone, in their places; GUIDED on every row."""
        chosen, metrics = self.guidance.choose(scored)
        flags = torch.zeros(len(scored), dtype=torch.bool)
        if chosen:
            rows = sorted(chosen)
            rebuilt = responses_to_batch(batch, Guidance.substitute(sampled, chosen), max_response_length=self.max_response_length,
                                         pad_token_id=self.pad_token_id)
            failures = self.first_failures
            references, _ = self.score(roles, batch.union(rebuilt).index(rows))
            self.first_failures = failures or self.first_failures
            metrics |= reference_wrong(references)
            others = [row for row in range(len(scored)) if row not in chosen]
            joined = join_rollouts([scored.index(others), references], self.pad_token_id)
            scored = Batch(joined.tensors, joined.non_tensors, scored.meta).reorder(np.argsort(others + rows))
            flags[rows] = True
        return scored.union(Batch.from_dict({keys.GUIDED: flags})), metrics

    def finish_batch(self, batch: Batch, metrics: Metrics) -> tuple[Batch, Metrics]:
        """What is decided across the whole training batch: the rewards' normalisation (``env.reward_norm``)."""
        return normalize_rewards(batch, self.reward_norm), metrics

    def score(self, roles: RolloutRoles, batch: Batch) -> tuple[Batch, Metrics]:
        result = self.reward_manager(batch) if self.calls is None else self._score_calls(batch)
        self.first_failures = {"reward": result.first_failure} if result.first_failure else {}
        scored = batch.union(result.to_batch().select(meta_keys=[]))
        if roles.reward_model is not None:
            model_scores = roles.reward_model.compute_rm_score(batch)[keys.TOKEN_SCORES]
            scored.tensors[keys.TOKEN_SCORES] = scored[keys.TOKEN_SCORES] + model_scores
        return scored, dict(result.metrics)

    def _score_calls(self, batch: Batch) -> RewardResult:
        decoded = decode_responses(batch, self.reward_manager.tokenizer)
        answers, self._counts = self.calls(decoded.texts, batch)
        result = place_answer_scores(self.reward_manager.score(answers), decoded)
        result.metrics |= calls_metrics(self._counts)
        return result


def check_scorable(score_functions: Mapping[str, ScoreFunction], datasets: Iterable[RLDataset | None]) -> None:
    """Raise DataFormatError listing every row of ``datasets`` that ``score_functions`` cannot score:
    its data_source has no function there, or its ground truth is missing (they all compare with it)."""
    problems = []
    for dataset in datasets:
        for sample in dataset.samples if dataset is not None else ():
            if sample.data_source not in score_functions:
                problems.append(RowProblem(sample.file, sample.row, "data_source", f"{sample.data_source!r} has no score function",
                                           unknown_source_fix(score_functions)))
            elif lacks_ground_truth(sample.ground_truth):
                problems.append(RowProblem(sample.file, sample.row, "reward_model.ground_truth",
                                           f"{sample.ground_truth!r} is no answer to compare with", GROUND_TRUTH_FIX))
    if problems:
        raise DataFormatError(problems_report(problems))
