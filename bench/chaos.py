"""A fault hook for chaos runs (the app's `--chaos`, the soak bench and the tests): some requests fail mid-stream.

The scheduler calls a fault hook as `hook(request id, round index, step)` before each step of each request
(`specdec.failure.FaultHook`); what it raises is that step's own failure.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class chaos:  # noqa: N801 (used as a function: `chaos(0.25)` is a fault hook)
    """A fault hook for chaos runs: about `fraction` of requests (by id) fail in round `at_round`,
    alternately with a simulated CUDA out-of-memory in the shared forward and an error in their verify.
    A plain value, so that it can be sent to an engine process."""

    fraction: float
    at_round: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"`fraction` must be in (0, 1], got {self.fraction!r}")

    def __call__(self, rid: int, index: int, step: str) -> None:
        every = round(1 / self.fraction)
        if rid % every == every - 1 and index == self.at_round:
            if (rid // every) % 2 == 0 and step == "forward":
                raise torch.OutOfMemoryError("CUDA out of memory (injected by the chaos hook)")
            if (rid // every) % 2 == 1 and step == "verify":
                raise RuntimeError("injected by the chaos hook")
