"""components/compare.py: the race on one engine clock, on the embedded model."""
from __future__ import annotations

import gradio as gr
import pytest

from components.session import Session
from conftest import race_controls


def test_compare_races_both_lanes_and_checks_greedy_identity(handlers):
    session = Session()
    out = list(handlers.compare("def f(x):", *race_controls(max_new_tokens=6), session))
    assert out[0][0] == "Warming up both decoders…"
    last = out[-1]
    assert "identical" in last[0] and "Median ratio" in last[0] and "over 3 interleaved pairs" in last[0]
    assert any("pair 3 of 3" in u[0] for u in out)  # the race was timed again, its lanes in turn
    assert last[1].count("sd-tok") == 6 and last[2].count("sd-baseline") == 6
    assert session.active is None and session.run is None  # a race is not the session's Generate run


def test_compare_refuses_a_bad_request_before_warming_up(handlers):
    with pytest.raises(gr.Error, match="drafts nothing"):
        next(handlers.compare("def f(x):", *race_controls(tree="none", lookup=0), Session()))


def test_compare_races_two_drafters(handlers):
    """Against another drafter: both lanes draft (EAGLE-3's tree against the heads'), the table names both, the
    ratio is one drafter's tok/s over the other's, and greedy texts are identical (both equal plain greedy)."""
    session = Session()
    out = list(handlers.compare("def f(x):", *race_controls(versus="trained", tree="eagle3", max_new_tokens=12),
                                session))
    md, a, b = out[-1]
    assert "EAGLE-3" in md and "heads, trained tree" in md
    assert "EAGLE-3 (prompt lookup 10, first) tok/s ÷ heads, trained tree" in md and "Why " in md
    assert "tokens per ms" in md
    assert "identical" in md and "both drafters" in md
    assert a.count("sd-tok") == 12 and b.count("sd-tok") == 12
    assert "sd-accepted" in a and "sd-accepted" in b  # both lanes drafted (no plain lane)
    with pytest.raises(gr.Error, match="versus"):
        next(handlers.compare("def f(x):", *race_controls(versus="hydra"), Session()))
