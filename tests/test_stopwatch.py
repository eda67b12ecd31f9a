"""specdec/stopwatch.py: laps add up, and the total covers them."""
from __future__ import annotations

import time

from specdec.stopwatch import Stopwatch


def test_laps_accumulate_and_total_covers_them():
    clock = Stopwatch()
    time.sleep(0.002)
    clock.lap("draft")
    clock.lap("forward")
    time.sleep(0.002)
    clock.lap("draft")  # a second lap of the same step adds to it
    t = clock.total()
    assert set(t) == {"draft", "forward", "total"}
    assert t["draft"] >= 4.0 and t["forward"] >= 0.0
    assert t["total"] >= t["draft"] + t["forward"]
