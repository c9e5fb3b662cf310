"""``@register``: marks a worker method as callable from the controller, and says how.

``dispatch`` decides what each rank receives, ``execute`` which ranks run, ``blocking`` whether the
controller waits (a non-blocking call returns futures that can be handed to the next call as they are).
``borrow_inputs=True`` declares that the method never writes to the Batches it receives, so on Ray
their tensors stay views of the object store's read-only shared memory instead of being copied
(one copy of every input saved; a write into such a tensor would corrupt the stored object).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

F = TypeVar("F", bound=Callable)

REGISTER_ATTR = "_posttrain_register"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"              # every rank gets the same arguments; outputs as a list by rank
    ALL_TO_ALL = "all_to_all"              # each argument is a list with one entry per rank
    DP_COMPUTE_PROTO = "dp_compute_proto"  # Batch arguments are padded, chunked across ranks, re-joined
    RANK_ZERO = "rank_zero"                # only rank 0 is called; its output is returned
    DP_MESH = "dp_mesh"                    # chunked by the data-parallel rank each worker declares;
                                           # collected from the workers that declare is_collect


class Execute(enum.Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class Registration:
    dispatch: Dispatch
    execute: Execute
    blocking: bool
    borrow_inputs: bool = False


def register(
    dispatch: Dispatch = Dispatch.ALL_TO_ALL, execute: Execute = Execute.ALL, blocking: bool = True, borrow_inputs: bool = False
) -> Callable[[F], F]:
    if not isinstance(dispatch, Dispatch) or not isinstance(execute, Execute):
        raise TypeError(f"register(dispatch=Dispatch.X, execute=Execute.Y); got {dispatch!r}, {execute!r}")

    def mark(method: F) -> F:
        setattr(method, REGISTER_ATTR, Registration(dispatch, execute, blocking, borrow_inputs))
        return method

    return mark


def registered_methods(cls: type) -> dict[str, Registration]:
    """Name -> Registration for every ``@register``-ed method of ``cls`` and its bases."""
    found = {}
    for name in dir(cls):
        registration = getattr(getattr(cls, name, None), REGISTER_ATTR, None)
        if registration is not None:
            found[name] = registration
    return found
