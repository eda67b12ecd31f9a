"""Pace: how fast a Generate run's rounds are shown, so a person can read each round's tree and narration.

The engine decodes at full speed (the scheduler has no way to hold one request between two rounds without
holding its thread, and so every other request of the batch); its events wait in the run's stream and a
`Pacer` hands them to the view one by one. So pacing never enters the engine's timings, tokens/s, Compare
or the metrics, and never slows another request. "fast" shows rounds as they come (the API's default);
"step" shows one more round per click of the step button.

Live sliders still act on the next round shown: the rounds the engine made ahead of the view under the old
settings are dropped, and the run resumes from the shown round with the new ones (`Feed`, `stale`), as a new
request whose first round re-reads the context (the prefix cache makes that one forward cheap).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

from specdec import RoundEvent, SamplingParams
from specdec.stats import SAMPLER_KEYS

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


def stale(ev: RoundEvent, live: SamplingParams) -> bool:
    """A round made ahead of the view under other sampler settings than the live ones."""
    now = live.to_dict()
    return any(ev.params.get(k) != now[k] for k in SAMPLER_KEYS)


class Feed:
    """The engine's `on_round` callback for one request of a run: each event renumbered after the run's rounds
    before it (a resumed request's round 0 is the run's next round, its first token plain decoding's) and
    stored in the run, then handed to `hooks`, until `close`: a round the engine made after its request was
    dropped never reaches the run."""

    def __init__(self, run: Run, hooks: Iterable[Callable[[RoundEvent], None]] = ()) -> None:
        self.run = run
        self.hooks = list(hooks)
        self.rounds, self.tokens = len(run.events), len(run.token_ids)  # where this request takes over
        self._lock = threading.Lock()
        self.open = True

    def shift(self, ev: RoundEvent) -> RoundEvent:
        """`ev` as the run's round (the identity for the run's first request)."""
        if not self.rounds:
            return ev
        emitted = ev.emitted if ev.index else tuple(replace(t, kind="baseline") for t in ev.emitted)
        return replace(ev, index=ev.index + self.rounds, total_tokens=ev.total_tokens + self.tokens, emitted=emitted,
                       extra={**ev.extra, "resumed": True} if ev.index == 0 else ev.extra)

    def __call__(self, ev: RoundEvent) -> None:
        ev = self.shift(ev)
        with self._lock:
            if not self.open:
                return
            self.run.record(ev)
        for hook in self.hooks:
            hook(ev)

    def close(self, keep: int) -> None:
        """No more events from this request; the run keeps its first `keep` rounds."""
        with self._lock:
            self.open = False
            del self.run.events[keep:]
