"""components/round_views.py: show, clamp, jump and replay the rounds of the last run."""
from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go
import pytest

from components.handlers import Handlers
from components.session import Session
from conftest import CONTROLS


def test_round_views_clamp_jump_and_replay(handlers):
    session = Session()
    assert handlers.show_round(3, session)[2] is None  # no run yet: empty, no error
    list(handlers.generate("def fibonacci(n):", *{**CONTROLS, "max_new_tokens": 24, "tree": "default"}.values(),
                           session))
    n = len(session.run.events)
    assert handlers.show_round(10_000, session)[2]["index"] == n - 1  # clamped, never an error
    assert handlers.show_round(-4, session)[2]["index"] == 0
    assert handlers.step_round(2, session, 1)[2]["index"] == 3
    with pytest.raises(gr.Error, match="`round` must be an integer"):
        handlers.show_round("x", session)
    longest = handlers.jump_longest(session)[2]
    assert len([t for t in longest["emitted"] if t["kind"] == "accepted"]) == max(
        sum(t.kind == "accepted" for t in ev.emitted) for ev in session.run.events)
    rejected = handlers.jump_rejection(0, session)[2]
    assert any(nd["status"] == "rejected" for nd in rejected["nodes"])
    replay = Handlers(handlers.loaded, replay_interval=0.0)
    steps = list(replay.replay(n - 1, session))  # from the last round: starts again at round 0
    assert [s[2]["index"] for s in steps] == list(range(n))
    assert all(f'data-round="{i}"' in s[4] for i, s in enumerate(steps))  # the round's tokens are outlined
    assert all("<table>" in s[5] or "drafted nothing" in s[5] for s in steps)  # the round's nodes
    assert all(isinstance(s[6], go.Figure) for s in steps)
    assert [s[2]["index"] for s in replay.replay(2, session)] == list(range(n))  # ▶ always from round 0
    assert [s[2]["index"] for s in replay.replay_from_here(2, session)] == list(range(2, n))
