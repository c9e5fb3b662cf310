"""The search environment: an agent answers a question, calling a retriever as often as it likes.

This is Search-R1's environment (Jin et al., 2025, "Search-R1: Training LLMs to Reason and Leverage
Search Engines with Reinforcement Learning") behind the :class:`~posttrain.agents.env.Environment`
interface. An agent turn ends on ``</search>`` or ``</answer>`` (the stop strings) and the
environment reads its action:

- **The rule.** The action is the FIRST complete ``<search>…</search>`` or ``<answer>…</answer>``
  block of the turn, wherever it starts, so reasoning may come before it (Search-R1's
  ``re.search(r"<(search|answer)>(.*?)</\\1>")``). Generation stops at the first closing tag, so in a
  turn the engine produced the first complete block is also the last one. An opened tag that is
  never closed is not an action; a turn without a complete block is invalid.
- **Answer.** The episode ends. Reward 1.0 if the answer inside the tags exactly matches a gold
  answer after SQuAD normalisation (:func:`exact_match`), else ``format_score`` for a non-empty
  answer, else 0. Only the action's text is scored — never the prompt, which may hold the words
  of the answer. ``info.success`` is the exact match.
- **Search.** The query (stripped, cut to ``max_query_chars``) goes to the retriever for ``topk``
  hits, shown as Search-R1 formats them::

      \\n<information>Doc 1 (Title: T) text\\nDoc 2 (Title: T2) text2</information>\\n

  Reward 0, or ``search_hit_score`` the first time in an episode that the hits hold a gold answer
  (a per-turn reward for finding the evidence: without it a small model that never answers right
  gets no signal at all; 0 turns it off), plus ``search_penalty`` (a reward ``<= 0``, default 0) for
  every search the retriever answered, the one that finds the evidence included: a price on each
  search, so that of two right answers the one with fewer searches scores higher; and
  ``repeated_search_penalty`` (a reward ``<= 0``, default 0) for a search whose query, normalised as
  answers are, equals one the retriever already answered in this episode: the same results again,
  a wasted turn (it prices that waste without pricing the searches a question needs). The episode
  goes on. An empty query, or an unparseable turn, is invalid: the observation says what a valid
  action looks like and the reward is ``invalid_action_penalty``.
- **Sign convention.** Rewards are added as they are, so a penalty is a reward ``<= 0``
  (``invalid_action_penalty=-0.1`` costs 0.1 per invalid turn); a positive one is refused.
- **Retriever failures** never raise: the step says the search failed (try again or answer), is
  valid but not effective, and counts ``retriever_errors``.
- **The final turn** (``finish``): an answer is scored as above; a search is not run and counts as
  invalid (``invalid_action_penalty``); the episode ends either way.

``step_batch`` sends ONE ``retrieve`` call per retriever object for a whole turn (all searching
episodes' queries in episode order, at the largest ``topk`` among them, each episode keeping its
own ``topk`` best); each result is built by the same code as :meth:`SearchEnv.step`.

Counters (``info.counts``): ``answers``, ``searches``, ``repeated_searches``, ``evidence_found``, ``invalid``,
``empty_queries``, ``truncated_queries``, ``retriever_errors``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from posttrain.agents.env import EpisodeSample, Environment, StepInfo, StepResult
from posttrain.agents.retriever.types import MAX_TOPK, Hit, RetrieverError
from posttrain.errors import InputError
from posttrain.rewards.search_answer import exact_match, gold_answers, normalize_answer

__all__ = ["SearchEnv", "exact_match", "format_hits", "gold_answers", "normalize_answer"]

logger = logging.getLogger(__name__)

class Retriever(Protocol):
    """What the environment needs of a retriever (``RetrieverClient`` or a test's fake)."""

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]: ...


def format_hits(hits: Sequence[Hit], information_tag: str = "information") -> str:
    """Search-R1's observation for the hits of one query (``No documents found.`` for none)."""
    lines = [f"Doc {i} (Title: {hit.document.title}) {hit.document.text}" for i, hit in enumerate(hits, start=1)]
    return f"\n<{information_tag}>" + ("\n".join(lines) or "No documents found.") + f"</{information_tag}>\n"


@dataclass(frozen=True)
class _Search:
    """A parsed search waiting for its hits."""

    query: str
    truncated: bool


class SearchEnv(Environment):
    """One question answered with a search engine; see the module docstring for the rules."""

    name: ClassVar[str] = "search"
    counters: ClassVar[tuple[str, ...]] = (
        "answers", "searches", "repeated_searches", "evidence_found", "invalid", "empty_queries", "truncated_queries", "retriever_errors",
    )

    def __init__(
        self,
        retriever: Retriever,
        *,
        topk: int = 3,
        search_tag: str = "search",
        answer_tag: str = "answer",
        information_tag: str = "information",
        invalid_action_penalty: float = 0.0,
        format_score: float = 0.0,
        search_hit_score: float = 0.0,
        search_penalty: float = 0.0,
        repeated_search_penalty: float = 0.0,
        max_query_chars: int = 300,
    ) -> None:
        _check_options(topk, (search_tag, answer_tag, information_tag), invalid_action_penalty,
                       {"search_penalty": search_penalty, "repeated_search_penalty": repeated_search_penalty}, format_score, max_query_chars)
        self.search_penalty = search_penalty
        self.repeated_search_penalty = repeated_search_penalty
        self._answered_queries: set[str] = set()
        if not 0 <= search_hit_score < 1:
            raise InputError(f"SearchEnv options: search_hit_score={search_hit_score} must lie in [0, 1): it rewards finding the evidence below answering right")
        self.search_hit_score = search_hit_score
        self._found_evidence = False
        self.retriever = retriever
        self.topk = topk
        self.search_tag, self.answer_tag, self.information_tag = search_tag, answer_tag, information_tag
        self.invalid_action_penalty = invalid_action_penalty
        self.format_score = format_score
        self.max_query_chars = max_query_chars
        tags = "|".join(re.escape(tag) for tag in (search_tag, answer_tag))
        self._action = re.compile(rf"<({tags})>(.*?)</\1>", re.DOTALL)
        self._golds: tuple[str, ...] | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (f"</{self.search_tag}>", f"</{self.answer_tag}>")

    def reset(self, sample: EpisodeSample) -> str:
        self._golds = gold_answers(sample.ground_truth)
        self._found_evidence = False
        self._answered_queries = set()
        return ""

    def final_turn_instruction(self) -> str:
        return f"You have no searches left. Give your final answer now inside <{self.answer_tag}> and </{self.answer_tag}>."

    def step(self, action: str) -> StepResult:
        plan = self._plan(action)
        if isinstance(plan, StepResult):
            return plan
        hits = _retrieve(self.retriever, [plan.query], self.topk)
        return self._search_result(plan, None if hits is None else hits[0])

    def finish(self, action: str) -> StepResult:
        """The forced final turn: an answer is scored; anything else (a search too) is invalid, and it ends."""
        parsed = self._parse(action)
        if parsed is not None and parsed[0] == self.answer_tag:
            return self._answer_result(parsed[1])
        return StepResult("", self.invalid_action_penalty, True, StepInfo(valid=False, effective=False, counts={"invalid": 1}))

    @classmethod
    def step_batch(cls, envs: Sequence[Environment], actions: Sequence[str]) -> list[StepResult]:
        """Step every episode; all searches to one retriever go in one ``retrieve`` call."""
        search_envs = [_as_search_env(env) for env in envs]
        plans = [env._plan(action) for env, action in zip(search_envs, actions, strict=True)]
        by_retriever: dict[int, list[int]] = {}
        for i, plan in enumerate(plans):
            if isinstance(plan, _Search):
                by_retriever.setdefault(id(search_envs[i].retriever), []).append(i)
        hits: dict[int, list[Hit] | None] = {}
        for members in by_retriever.values():
            topk = max(search_envs[i].topk for i in members)
            found = _retrieve(search_envs[members[0]].retriever, [plans[i].query for i in members], topk)
            for position, i in enumerate(members):
                hits[i] = None if found is None else found[position][: search_envs[i].topk]
        return [plan if isinstance(plan, StepResult) else search_envs[i]._search_result(plan, hits[i])
                for i, plan in enumerate(plans)]

    def _parse(self, action: str) -> tuple[str, str] | None:
        """``(tag, content)`` of the first complete action block, or None."""
        found = self._action.search(action)
        return None if found is None else (found.group(1), found.group(2).strip())

    def _plan(self, action: str) -> StepResult | _Search:
        """The finished result of an answer or an invalid turn, or the search still to run."""
        parsed = self._parse(action)
        if parsed is None:
            return self._invalid(f"Your previous action is invalid. {self._how_to_act()}", {"invalid": 1})
        tag, content = parsed
        if tag == self.answer_tag:
            return self._answer_result(content)
        if not content:
            return self._invalid(f"Your search query was empty. {self._how_to_act()}", {"invalid": 1, "empty_queries": 1})
        query = content[: self.max_query_chars].strip()
        return _Search(query, truncated=len(content) > self.max_query_chars)

    def _answer_result(self, answer: str) -> StepResult:
        if self._golds is None:
            raise RuntimeError("SearchEnv.step before reset: call reset(sample) to give the episode its gold answers")
        success = exact_match(answer, self._golds)
        reward = 1.0 if success else (self.format_score if answer else 0.0)
        return StepResult("", reward, True, StepInfo(valid=True, effective=True, success=success, counts={"answers": 1}))

    def _search_result(self, search: _Search, hits: list[Hit] | None) -> StepResult:
        """The step of a search given its hits (None: the retriever failed)."""
        counts = {"truncated_queries": 1} if search.truncated else {}
        if hits is None:
            observation = f"\n<{self.information_tag}>The search failed. {self._how_to_act()}</{self.information_tag}>\n"
            return StepResult(observation, 0.0, False, StepInfo(valid=True, effective=False, counts={**counts, "retriever_errors": 1}))
        observation = format_hits(hits, self.information_tag)
        reward = self.search_penalty
        query = normalize_answer(search.query)
        if query in self._answered_queries:
            reward += self.repeated_search_penalty
            counts["repeated_searches"] = 1
        self._answered_queries.add(query)
        if self._golds is not None and not self._found_evidence and holds_answer(hits, self._golds):
            self._found_evidence = True  # paid once per episode, so repeating a search earns nothing
            reward += self.search_hit_score
            counts["evidence_found"] = 1
        return StepResult(observation, reward, False, StepInfo(valid=True, effective=True, counts={**counts, "searches": 1}))

    def _how_to_act(self) -> str:
        # No placeholder words inside the tags: small models copy "<search> query </search>" literally.
        return (f"To search, write your query between <{self.search_tag}> and </{self.search_tag}>. "
                f"To answer, write the answer between <{self.answer_tag}> and </{self.answer_tag}>.")

    def _invalid(self, observation: str, counts: dict[str, float]) -> StepResult:
        return StepResult(observation, self.invalid_action_penalty, False, StepInfo(valid=False, effective=False, counts=counts))


def holds_answer(hits: Sequence[Hit], golds: tuple[str, ...]) -> bool:
    """Whether a gold answer occurs (normalised, as whole words) in the text of any hit."""
    texts = [f" {normalize_answer(hit.document.contents)} " for hit in hits]
    return any(f" {normalize_answer(gold)} " in text for gold in golds for text in texts)


def _retrieve(retriever: Retriever, queries: list[str], topk: int) -> list[list[Hit]] | None:
    """One hit list per query, or None when the retriever failed (logged, never raised)."""
    try:
        found = retriever.retrieve(queries, topk)
    except RetrieverError as error:
        logger.warning("search failed for %d queries: %s", len(queries), error)
        return None
    if len(found) != len(queries):
        logger.warning("the retriever returned %d hit lists for %d queries; treating the search as failed", len(found), len(queries))
        return None
    return found


def _as_search_env(env: Environment) -> SearchEnv:
    if not isinstance(env, SearchEnv):
        raise TypeError(f"SearchEnv.step_batch got a {type(env).__name__}; step each environment class with its own step_batch")
    return env


def _check_options(topk: int, tags: tuple[str, ...], penalty: float, search_penalties: dict[str, float], format_score: float,
                   max_query_chars: int) -> None:
    problems = []
    if not 1 <= topk <= MAX_TOPK:
        problems.append(f"topk={topk} must be 1 to {MAX_TOPK} (the retriever's limit)")
    if len(set(tags)) != len(tags) or not all(re.fullmatch(r"\w+", tag) for tag in tags):
        problems.append(f"the tags {tags} must be distinct words, e.g. ('search', 'answer', 'information')")
    if not penalty <= 0:
        problems.append(f"invalid_action_penalty={penalty} is a reward added per invalid turn, so it must be <= 0 (e.g. -0.1)")
    problems += [f"{name}={value} is a reward added per search, so it must be <= 0 (e.g. -0.01)"
                 for name, value in search_penalties.items() if not value <= 0]
    if not 0 <= format_score < 1:
        problems.append(f"format_score={format_score} must lie in [0, 1): it rewards a well-formed wrong answer below a right one")
    if max_query_chars < 1:
        problems.append(f"max_query_chars={max_query_chars} must be at least 1")
    if problems:
        raise InputError("SearchEnv options: " + "; ".join(problems))
