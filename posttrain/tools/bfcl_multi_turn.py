"""BFCL's multi-turn APIs as a tool class: ``env.tools: ["posttrain.tools.bfcl_multi_turn:BfclMultiTurn"]``.

One instance per episode, in the episode's own process (instances.py), like any tool class
(docs/tools.md "Tool classes", "BFCL multi-turn"). It has no tools of its own: it runs **the row's
tools** (``extra_info.tools``, the row's involved classes' functions, written by ``posttrain prepare
bfcl``) through its ``call_row_tool`` hook, so each row is told and runs only its own functions.

- ``reset``: fresh instances of the row's ``involved_classes``, loaded with its ``initial_config``
  (:func:`~posttrain.rewards.bfcl_multi_turn.load_instances`; never BFCL's module-level cache), and the
  name table that routes a method name to its instance (the later class wins a shared name, as in BFCL).
- ``call_row_tool(name, arguments)``: the call runs on the live instance, its result is the text BFCL
  makes of it, and the call is recorded in BFCL's decoded form (``name(k=repr(v),...)``) in the current
  user turn, one step per call (BFCL's checker runs a turn's steps one after another on the same
  instances and joins their results, so how a turn's calls are split into steps does not change its verdict).
- ``end_turn``: the environment (``env.options.answer: turns``) says a user turn has ended.
- ``reward``: BFCL's own multi-turn checker on the recorded turns against the row's ground truth
  (:func:`~posttrain.rewards.bfcl_multi_turn.check_turns`): ``{"score", "acc"}``, 1.0 when it passes.
  A call that posttrain refused before it ran (unknown tool, arguments against the schema) is not
  recorded; BFCL would have run it to an error, which changes no state.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.rewards import bfcl_multi_turn as bfcl


class BfclMultiTurn:
    """One episode of a BFCL multi-turn row (module docstring)."""

    def reset(self, id: str, initial_config: Any, involved_classes: Any, ground_truth: Any) -> None:  # noqa: A002 - BFCL's field name
        self._entry = {"id": id, "initial_config": _json(initial_config), "involved_classes": _json(involved_classes)}
        self._ground_truth = _json(ground_truth)
        long_context = "long_context" in id or "composite" in id  # as BFCL's checker decides it
        self._instances = bfcl.load_instances(self._entry["involved_classes"], self._entry["initial_config"], long_context=long_context)
        self._owners = bfcl.method_owners(self._instances)
        self._turns: list[list[list[str]]] = []
        self._turn: list[list[str]] = []

    def call_row_tool(self, name: str, arguments: dict[str, Any]) -> str:
        owner = self._owners.get(name)
        if owner is None:
            raise ValueError(f"no API of this task has a function {name!r}")
        self._turn.append([bfcl.call_text(name, arguments)])
        return bfcl.run_call(self._instances[owner], name, arguments)

    def end_turn(self) -> None:
        self._turns.append(self._turn)
        self._turn = []

    def reward(self) -> dict[str, float]:
        verdict = bfcl.check_turns(self._turns, self._ground_truth, self._entry)
        return {"score": float(verdict.valid), "acc": float(verdict.valid)}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
