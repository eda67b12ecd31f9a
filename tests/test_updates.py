"""components/updates.py: pacing and user errors."""
from __future__ import annotations

from components.handlers import Throttle


def test_throttle():
    t = Throttle(60.0)
    assert t() and not t() and t(force=True)


def test_throttle_shares_its_budget_but_not_the_first_update():
    busy = Throttle(60.0, scale=lambda: 8)
    assert not busy()  # with 8 runs streaming, a figure waits for its share of the budget
    first = Throttle(60.0, scale=lambda: 8, first=True)
    assert first() and not first()  # the first token's update goes out at once, then the shared pace
