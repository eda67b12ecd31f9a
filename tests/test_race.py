"""components/race.py: the race's numbers and why one lane won, from synthetic events."""
from __future__ import annotations

import pytest

from conftest import race_lane


def test_race_explains_a_slowdown_from_the_runs_own_numbers():
    from components.race import explain, lane_numbers, race_markdown, race_ratio
    spec = race_lane([2, 1, 2, 1], total_ms=30.0, forward_ms=20.0, nodes=16)  # 1.5 tokens per round
    base = race_lane([1] * 6, total_ms=10.0, forward_ms=9.0, nodes=0)
    s, b = lane_numbers(spec, 0.2), lane_numbers(base, 0.1)
    assert (s["forwards"], s["tokens"], b["forwards"]) == (5, 7, 7)
    assert race_ratio(s, b) == pytest.approx((7 / 0.2) / (7 / 0.1))
    text = explain(spec, base, race_ratio(s, b), "CPU", temperature=0.7)
    assert "lost" in text and "**1.50** tokens" in text and "3.00× a plain step on this CPU" in text
    assert "16-node tree forward alone costs 2.22× a one-token forward" in text and "10.0 ms" in text
    assert "needs more than 3.00 tokens per forward" in text and "temperature 0.7" in text
    md = race_markdown(spec, 0.2, base, 0.1, done=True, max_new_tokens=8, greedy=False, acceptance="lossless")
    assert "**Measured ratio 0.50×** (**slower**: below 1)" in md and "| target forwards |" in md
    assert "Race running" in race_markdown(spec, 0.2, base, 0.1, done=False, max_new_tokens=8, greedy=True,
                                           acceptance="lossless")
    fast = explain(race_lane([4, 4], 12.0, 10.0, 16), base, 2.0)
    assert "won" in fast and "**4.00** tokens" in fast
