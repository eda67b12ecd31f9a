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
    md = race_markdown(spec, base, [(0.2, 0.1)], done=True, max_new_tokens=8, greedy=False, acceptance="lossless")
    assert "**Median ratio 0.50×** (**slower**: below 1)" in md and "| target forwards |" in md
    assert "Race running" in race_markdown(spec, base, [(0.2, 0.1)], done=False, max_new_tokens=8, greedy=True,
                                           acceptance="lossless")
    fast = explain(race_lane([4, 4], 12.0, 10.0, 16), base, 2.0)
    assert "won" in fast and "**4.00** tokens" in fast


def test_the_race_reports_the_median_of_its_pairs_and_one_tokens_per_forward():
    """Three pairs: the verdict is their median ratio with its range; the table's time is the median pair's; the
    table and the explanation state one tokens-per-forward figure (decoding rounds, the prefill excluded)."""
    from components.race import race_markdown
    spec = race_lane([2, 1, 2, 1], total_ms=30.0, forward_ms=20.0, nodes=16)
    base = race_lane([1] * 6, total_ms=10.0, forward_ms=9.0, nodes=0)
    md = race_markdown(spec, base, [(0.1, 0.1), (0.1, 0.2), (0.1, 0.125)], done=True, max_new_tokens=8,
                       greedy=False, acceptance="lossless")
    assert "**Median ratio 1.25×** (faster, range 1.00–2.00× over 3 interleaved pairs)" in md
    row = next(line for line in md.splitlines() if line.startswith("| speculative"))
    assert row.rstrip(" |").split(" | ")[3:6] == ["1.50", "0.10", "70.0"]  # tokens / forward, median time, tok/s
    assert "**1.50** tokens" in md and "3 pairs" in md
    assert "identical" not in md and "the texts differ" in md  # two different token streams are not called identical
