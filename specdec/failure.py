"""How a request's part of a round ends: its event, or why it failed (a cause, a step, a message)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .events import RoundEvent

CAUSES = ("callback", "params", "non_finite", "out_of_memory", "error")

# fault_hook(request id, round index, step) runs before each request's steps; what it raises is that step's failure.
FaultHook = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Failure:
    """Why a request ended in error: the cause (one of CAUSES), the step and round, and the message."""

    cause: str
    step: str
    index: int
    message: str

    def __str__(self) -> str:
        return f"request failed in round {self.index} ({self.step}, {self.cause}): {self.message}"


class RequestFailed(RuntimeError):
    """A request ended in error inside its own round; `failure` says where and why. Other requests go on."""

    def __init__(self, failure: Failure, events: list[RoundEvent] | None = None) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.events = list(events or [])  # what the request had made before it failed


@dataclass(frozen=True)
class Outcome:
    """One request's part of a round: its event (None if it failed first), its failure and error if any."""

    event: RoundEvent | None
    failure: Failure | None = None
    error: BaseException | None = field(default=None, compare=False, repr=False)


def failed(step: str, e: BaseException, index: int) -> Outcome:
    """The outcome of a step that raised `e` in round `index`."""
    return Outcome(None, Failure(cause_of(step, e), step, index, message_of(e)), e)


def cause_of(step: str, exc: BaseException) -> str:
    """The cause (one of CAUSES) of an exception raised in `step`."""
    if isinstance(exc, torch.OutOfMemoryError):
        return "out_of_memory"
    if step in ("callback", "params"):
        return step
    return "error"


def message_of(e: BaseException) -> str:
    """An exception as a failure's message: its type and text."""
    return f"{type(e).__name__}: {e}"
