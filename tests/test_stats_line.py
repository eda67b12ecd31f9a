"""components/stats_line.py: the stats line in a reader's words, over specdec.stats.summarize."""
from __future__ import annotations

import pytest

from components import plots
from components.handlers import round_markdown
from components.stats_line import stats_markdown
from components.tokens import legend_html, render_round
from conftest import P0, by_name, lookup_event, prefill_event, run_events, tree_event
from specdec.stats import accepted_by_lookup, change_rounds, params_changed, summarize


def test_lookup_drafts_in_stats_tokens_and_charts():
    events = [prefill_event(), tree_event(1), lookup_event()]
    assert accepted_by_lookup(lookup_event()) == 5 and accepted_by_lookup(tree_event()) == 0
    s = summarize(events)
    assert s["accepted_drafts"] == 7 and s["lookup_drafts"] == 5 and s["lookup_rounds"] == 1
    assert "accepted drafts: 2 by heads, **5** by prompt lookup (which drafted in 1 of the rounds)" in stats_markdown(s)
    assert "prompt lookup" not in stats_markdown(summarize(run_events()))
    assert "accepted drafts: 2 by EAGLE-3, **5** by prompt lookup" in stats_markdown(s, drafter="EAGLE-3")
    out = render_round(lookup_event())
    assert out.count("sd-lookup") == 5
    assert 'title="round 1 · accepted draft (prompt lookup) · draft q=- · target p=0.900"' in out
    assert "sd-lookup" not in render_round(tree_event())
    t = by_name(plots.accepted_length_figure(events))
    assert list(t["accepted drafts (heads)"].y) == [2, 0]
    assert list(t["accepted drafts (prompt lookup)"].y) == [0, 5]
    assert "sd-lookup" in legend_html()
    assert "10 drafts, 8 by prompt lookup, 5 of them accepted ·" in round_markdown(lookup_event())


def test_summarize_and_stats_line():
    s = summarize(run_events(), wall_seconds=0.5)
    assert s["rounds"] == 3 and s["new_tokens"] == 10 and s["accepted_drafts"] == 6
    assert s["mean_accepted_length"] == 3.0
    assert s["tokens_per_second"] == pytest.approx(10 / 0.05)
    assert s["changes"] == 1 and not s["lossy"]
    line = stats_markdown(s, stopped=True)
    assert "over 3 rounds, prefill excluded" in line and "stopped" in line
    assert change_rounds(run_events()) == [(3, {"temperature": (0.7, 1.2)})]
    assert params_changed(None, P0) == {}


def test_status_words_are_plain():
    s = summarize(run_events())
    for finished, words in (("length", "done: reached max new tokens"), ("context", "context window is full"),
                            ("eos", "the model ended the text")):
        line = stats_markdown({**s, "finished": finished})
        assert words in line and "status:" not in line
    assert "stopped by you" in stats_markdown({**s, "finished": None}, stopped=True)


def test_a_run_of_the_prefill_alone_says_so():
    s = summarize([prefill_event()])
    line = stats_markdown(s)
    assert line.startswith("**1** token from the prefill alone") and "n/a" not in line and "0 decoding" not in line
