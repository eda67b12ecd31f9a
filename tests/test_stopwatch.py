"""specdec/stopwatch.py: laps add up, and the total covers them (on a clock the test sets)."""
from __future__ import annotations

import pytest

import specdec.stopwatch as stopwatch
from specdec.stopwatch import Stopwatch


@pytest.fixture
def clock(monkeypatch):
    """A host clock that reads what the test says (seconds)."""
    now = [100.0]
    monkeypatch.setattr(stopwatch.time, "perf_counter", lambda: now[0])
    return now


def test_laps_accumulate_and_total_covers_them(clock):
    sw = Stopwatch()
    clock[0] += 0.002
    sw.lap("draft")  # 2 ms since the start
    clock[0] += 0.001
    sw.lap("forward")  # 1 ms since the previous lap, not since the start
    clock[0] += 0.003
    sw.lap("draft")  # a second lap of the same step adds to it
    clock[0] += 0.004  # time after the last lap counts in the total only
    t = sw.total()
    assert set(t) == {"draft", "forward", "total"}
    assert t["draft"] == pytest.approx(5.0) and t["forward"] == pytest.approx(1.0)
    assert t["total"] == pytest.approx(10.0)
