"""components/sampler_view.py: the sampler view, its cache, and its forwards under the model lock."""
from __future__ import annotations

import json

import gradio as gr
import pytest
import torch

from components.handlers import Handlers
from components.session import Session
from conftest import CONTROLS, by_name


def test_sampler_view_filters_and_keeps_its_rows_as_plain_values(handlers):
    session = Session()
    fig = handlers.sampler_view("def f(x):", 0.8, 5, 1.0, 0.0, "lossless", False, session)
    assert len(by_name(fig)["kept"].x) == 5
    cached = session.sampler_cache
    assert json.dumps(cached[1]) and not any(isinstance(v, torch.Tensor) for v in cached[0])  # no tensors kept
    handlers.sampler_view("def f(x):", 0.8, 5, 1.0, 0.0, "lossless", False, session)
    assert session.sampler_cache is cached  # same position, same settings: no second forward
    fig = handlers.sampler_view("def f(x):", 0.8, 3, 1.0, 0.0, "lossless", False, session)
    assert session.sampler_cache is not cached and len(by_name(fig)["kept"].x) == 3  # new settings, new rows
    greedy = handlers.sampler_view("def f(x):", 0.8, 3, 1.0, 0.0, "greedy", False, session)
    assert len(by_name(greedy)["kept"].x) == 1  # the greedy rule shows the argmax alone
    assert not handlers.sampler_view("", 0.8, 3, 1.0, 0.0, "lossless", False, session).data


def test_sampler_forwards_interleave_with_rounds_but_never_overlap(handlers, monkeypatch):
    """#10: the sampler view's forward takes the same model lock as each generation round."""
    import threading
    import time

    h = Handlers(handlers.loaded, figure_interval=0.0, text_interval=0.0)
    target = h.loaded.engine.target
    real = target.forward
    state = {"inside": 0, "overlaps": 0, "calls": 0}
    guard = threading.Lock()

    def spy(*args, **kwargs):  # a forward that takes a while, so that overlaps would be seen
        with guard:
            state["inside"] += 1
            state["calls"] += 1
            state["overlaps"] += state["inside"] > 1
        try:
            time.sleep(0.005)
            return real(*args, **kwargs)
        finally:
            with guard:
                state["inside"] -= 1

    monkeypatch.setattr(target, "forward", spy)
    session = Session()
    done = threading.Event()
    runner = threading.Thread(target=lambda: (list(h.generate("def fibonacci(n):", *{**CONTROLS, "max_new_tokens": 40,
                                                                                      "tree": "default"}.values(),
                                                              session)), done.set()))
    runner.start()
    views = 0
    while not done.is_set():
        if session.run is not None and session.run.events:
            session.sampler_cache = None  # force a fresh forward each time
            h.sampler_view("def fibonacci(n):", 0.5, 5 + views % 3, 1.0, 0.0, "lossless", False, session)
            views += 1
    runner.join()
    assert views >= 3 and state["calls"] > len(session.run.events) + 3  # sampler forwards ran during the run
    assert state["overlaps"] == 0


def test_a_tokens_law_is_computed_on_demand_at_its_position(handlers, monkeypatch):
    """A click on a token: the sampler view shows the law that token was drawn from (its round's settings),
    from one forward on the context before it; the final view of a run is computed the same way, and cached."""
    from conftest import figure

    h = Handlers(handlers.loaded, figure_interval=60.0, chart_interval=60.0, text_interval=60.0)
    calls = []
    real = h.gate.sampler_rows
    monkeypatch.setattr(h.gate, "sampler_rows", lambda *a: calls.append(a) or real(*a))
    session = Session()
    updates = list(h.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 12, "temperature": 0.9, "top_k": 7}.values(),
                              session))
    final = figure(updates[-1][8])
    assert any(t.startswith("★") for t in final.layout.yaxis.ticktext)  # the run's last token, starred
    n = len(calls)
    h._run_sampler(session, session.run, session.live)
    assert len(calls) == n  # same position, same settings: the cached rows
    run = session.run
    for position in (0, 5):
        fig = h.token_law(session, position)
        ids, params, _ = calls[-1]
        assert ids == run.prompt_ids + run.token_ids[:position] and params.top_k == 7 and params.seed is None
        assert f"where token {position + 1} was drawn" in fig.layout.title.text
        tok = run.token_ids[position]
        assert [r["token_id"] for r in session.sampler_cache[1]] == [r["token_id"] for r in real(ids, params, 20)]
        if tok in [r["token_id"] for r in session.sampler_cache[1]]:
            assert any(t.startswith("★") for t in fig.layout.yaxis.ticktext)
    assert h.token_law(session, 999) == gr.skip()  # a position past the run: the view stays


def test_out_of_range_typed_values_leave_each_box_showing_the_value_in_use(handlers):
    """max new tokens 0 (or 9999) is set to the nearest allowed value, with a toast; a refused live slider value
    leaves the session's values, which the page writes back into the boxes."""
    with pytest.warns(UserWarning, match="max_new_tokens"):
        assert Handlers.check_max_new(0) == 1
    with pytest.warns(UserWarning):
        assert Handlers.check_max_new(9999) == 512
    assert Handlers.check_max_new(24) == gr.skip()
    session = Session()
    handlers.sampler_view("def f(x):", 0.9, 7, 1.0, 0.0, "lossless", False, session)
    with pytest.raises(gr.Error, match="temperature"):
        handlers.sampler_view("def f(x):", 99, 7, 1.0, 0.0, "lossless", False, session)
    assert Handlers.live_values(session) == (0.9, 7, 1.0, 0.0)
