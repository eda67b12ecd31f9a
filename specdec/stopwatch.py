"""One small stopwatch for the engine's per-step timings (milliseconds, host clock)."""
from __future__ import annotations

import time


class Stopwatch:
    """`lap(name)` adds the time since the previous lap to `name`; `ms` holds the totals."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self.last) * 1e3
        self.last = now

    def total(self) -> dict[str, float]:
        """The laps plus "total", the time since the stopwatch started."""
        return {**self.ms, "total": (time.perf_counter() - self.start) * 1e3}
