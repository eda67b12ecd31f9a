"""Pace: how fast a Generate run's rounds are shown, so a person can read each round's tree and narration.

The engine decodes at full speed (the scheduler has no way to hold one request between two rounds without
holding its thread, and so every other request of the batch); its events wait in the run's stream and a
`Pacer` hands them to the view one by one. So pacing never enters the engine's timings, tokens/s, Compare
or the metrics, and never slows another request. "fast" shows rounds as they come (the API's default);
"step" shows one more round per click of the step button.
"""
from __future__ import annotations

import time

from .session import Run

PACE_CHOICES = (("fast (as computed)", "fast"), ("8 rounds/s", "8"), ("4 rounds/s", "4"), ("2 rounds/s", "2"),
                ("1 round/s", "1"), ("step (one round per click)", "step"))
PACES = tuple(v for _, v in PACE_CHOICES)
UI_PACE = "2"  # the page's default: each round's tree and narration stay up long enough to read
_POLL = 0.02  # seconds between two looks at Stop or a step click while a round waits


def check_pace(value) -> str:
    """A pace from the UI or the API ("2", 2 or 2.0 alike); None (an API call that sends none) is "fast"."""
    if value is None:
        return "fast"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{value:g}"
    if value not in PACES:
        raise ValueError(f"`pace` must be one of {list(PACES)}, got {value!r}")
    return value


class Pacer:
    """Holds each round of `run` until its time (or its click) has come; the first round goes at once."""

    def __init__(self, pace: str, run: Run) -> None:
        self.run = run
        self.step = pace == "step"
        self.period = None if pace in ("fast", "step") else 1.0 / float(pace)
        self.last: float | None = None  # when the last round was shown
        self.shown = 0  # rounds shown so far

    @property
    def paced(self) -> bool:
        return self.step or self.period is not None

    def wait(self) -> bool:
        """Block until the next round may be shown: True, or False once the run was stopped or replaced."""
        run = self.run
        if not self.paced:
            return True
        if self.last is not None:
            while not run.stopped:
                if self.step and run.steps >= self.shown:
                    break
                if self.period is not None and time.monotonic() - self.last >= self.period:
                    break
                time.sleep(_POLL)
        if run.stopped and self.shown:
            return False
        self.last, self.shown = time.monotonic(), self.shown + 1
        return True
