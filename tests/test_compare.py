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
    assert "identical" in last[0] and "Measured ratio" in last[0]
    assert last[1].count("sd-tok") == 6 and last[2].count("sd-baseline") == 6
    assert session.active is None and session.run is None  # a race is not the session's Generate run


def test_compare_refuses_a_bad_request_before_warming_up(handlers):
    with pytest.raises(gr.Error, match="drafts nothing"):
        next(handlers.compare("def f(x):", *race_controls(tree="none", lookup=0), Session()))
