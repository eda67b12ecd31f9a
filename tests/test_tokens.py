"""components/tokens.py: the coloured token stream."""
from __future__ import annotations

from components.tokens import KIND_COLORS, legend_html, render_round, render_tokens
from conftest import P0, prefill_event, run_events, tree_event
from specdec import EmittedToken, RoundEvent


def test_render_round_colours_kinds_and_hover():
    out = render_round(tree_event(4))
    assert out.count('class="sd-tok') == 3
    assert out.count("sd-accepted") == 2 and out.count("sd-correction") == 1
    assert 'title="round 4 · accepted draft · draft q=0.600 · target p=0.700"' in out
    assert "sd-nl" in out  # the newline token gets a visible marker
    assert set(KIND_COLORS) == {"accepted", "correction", "bonus", "baseline", "first"}


def test_render_tokens_escapes_and_marks_settings_changes():
    evil = RoundEvent(1, (), (0,), (EmittedToken(5, "<script>x</script>", "baseline", None, None),), dict(P0),
                      "plain", False, {"total": 1.0}, 2)
    out = render_tokens([prefill_event(kind="baseline"), evil])
    assert "<script>" not in out and "&lt;script&gt;x&lt;/script&gt;" in out
    assert "draft q=n/a" in out
    events = run_events()
    html = render_tokens(events)
    assert html.count('class="sd-change"') == 1
    assert "temperature 0.7→1.2" in html
    # append-only: each round only adds to the end (streamed as an append diff)
    assert html.startswith(render_tokens(events[:3]))
    # the prefill's token followed no draft path: it is the target's "first" token, never a "bonus"
    assert render_round(prefill_event()).count("sd-bonus") == 0
    assert render_round(prefill_event()).count("sd-first") == 1


def test_partial_utf8_token_renders_empty_span():
    toks = (EmittedToken(1, "", "baseline", None, 0.5), EmittedToken(2, "é", "baseline", None, 0.5))
    ev = RoundEvent(1, (), (0,), toks, dict(P0), "plain", False, {"total": 1.0}, 3)
    out = render_round(ev)
    assert "sd-partial" in out and ">é</span>" in out


def test_legend_lists_every_kind():
    out = legend_html()
    for kind in ("accepted", "correction", "bonus", "baseline"):
        assert f"sd-{kind}" in out
