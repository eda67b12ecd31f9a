"""components/updates.py: pacing and user errors."""
from __future__ import annotations

from components.handlers import Throttle


def test_throttle():
    t = Throttle(60.0)
    assert t() and not t() and t(force=True)
