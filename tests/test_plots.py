"""components/plots.py: the token labels, the per-run charts and the sampler view, from synthetic events."""
from __future__ import annotations

import pytest
import torch

import specdec
from components import plots
from conftest import P0, by_name, plain_event, prefill_event, run_events
from specdec.stats import depth_counts


def test_label_escapes_and_truncates():
    assert plots.label("<script>alert(1)</script>", 40) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert plots.label(" a\n") == "␣a↵"
    assert plots.label("") == "∅"
    assert plots.label("abcdefghijklmnop", 5) == "abcd…"


def test_accepted_length_figure_stacks_drafts_and_target_token():
    fig = plots.accepted_length_figure(run_events())
    t = by_name(fig)
    assert list(t["accepted drafts"].x) == [1, 2, 3]
    assert list(t["accepted drafts"].y) == [2, 2, 2]
    assert list(t["target token"].y) == [1, 1, 1]
    assert "mean 3.00" in fig.layout.title.text and "n = 3 rounds" in fig.layout.title.text
    # the settings change before round 3 is marked
    vlines = [s for s in fig.layout.shapes if s.x0 == s.x1]
    assert [s.x0 for s in vlines] == [2.5]


def test_depth_acceptance_states_the_denominator():
    rows = depth_counts(run_events()).rows()
    assert [(r["depth"], r["accepted"], r["reached"]) for r in rows] == [(1, 3, 3), (2, 3, 3), (3, 0, 3)]
    assert rows[2]["rate"] == 0 and rows[2]["given_prev"] == 0
    fig = plots.depth_acceptance_figure(run_events())
    assert list(fig.data[0].text) == ["3/3", "3/3", "0/3"]
    assert "denominator" in fig.layout.title.text


def test_throughput_and_empty_charts():
    fig = plots.throughput_figure(run_events())
    t = by_name(fig)
    assert t["this round"].y[1] == pytest.approx(3 / 0.010)
    assert t["cumulative"].y[-1] == pytest.approx(10 / 0.050)
    for builder in (plots.accepted_length_figure, plots.depth_acceptance_figure, plots.throughput_figure):
        assert not builder([]).data
    assert not plots.depth_acceptance_figure([prefill_event(), plain_event(1)]).data


def test_sampler_figure_greys_out_filtered_tokens():
    rows = [{"token_id": 1, "prob": 0.5, "filtered_prob": 0.6, "removed_by": None},
            {"token_id": 2, "prob": 0.3, "filtered_prob": 0.4, "removed_by": None},
            {"token_id": 3, "prob": 0.1, "filtered_prob": 0.0, "removed_by": "top_p"},
            {"token_id": 4, "prob": 0.05, "filtered_prob": 0.0, "removed_by": "min_p"}]
    fig = plots.sampler_figure(rows, lambda i: {1: " a", 2: "<b", 3: "c", 4: "d"}[i], P0)
    t = by_name(fig)
    assert list(t["kept"].y) == [0, 1] and t["kept"].marker.color == plots.KEPT_COLOR
    assert list(t["filtered out"].y) == [2, 3] and t["filtered out"].marker.color == plots.REMOVED_COLOR
    assert [c[4] for c in t["filtered out"].customdata] == ["removed by top-p", "removed by min-p"]
    # horizontal bars: labels read left to right, no rotated ticks, no tag on every filtered bar
    assert t["kept"].orientation == "h" and not t["filtered out"].text and fig.layout.xaxis.tickangle is None
    assert list(fig.layout.yaxis.ticktext) == ["␣a", "&lt;b", "c", "d"]
    assert fig.layout.title.text.startswith("The filters keep 2 of the 4 likeliest next tokens<br>")  # one count


def test_sampler_figure_from_real_filter_stages():
    from specdec.sampler import filter_stages
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    params = specdec.SamplingParams(temperature=1.0, top_k=3)
    rows = filter_stages(logits, params, top=6)
    fig = plots.sampler_figure(rows, str, params.to_dict())
    assert len(by_name(fig)["kept"].x) == 3 and len(by_name(fig)["filtered out"].x) == 3


def test_sampler_figure_stars_the_emitted_token():
    rows = [{"token_id": 1, "prob": 0.5, "filtered_prob": 0.6, "removed_by": None},
            {"token_id": 2, "prob": 0.3, "filtered_prob": 0.4, "removed_by": None}]
    fig = plots.sampler_figure(rows, {1: " a", 2: "\n"}.get, P0, emitted=2, emitted_prob=0.3)
    assert list(fig.layout.yaxis.ticktext) == ["␣a", "★ ↵"]
    assert by_name(fig)["kept"].marker.line.width == (0, 3)
    assert "★ = the token the run drew here (p = 0.300)" in fig.layout.title.text
    outside = plots.sampler_figure(rows, {1: " a", 2: "b", 9: "z"}.get, P0, emitted=9)
    assert "the run drew z" in outside.layout.title.text and "outside this top 2" in outside.layout.title.text


def test_accepted_length_figure_shows_the_dynamic_trees_expectation_and_size():
    import dataclasses
    events = run_events()
    assert "expected (dynamic tree)" not in by_name(plots.accepted_length_figure(events))  # static trees: no line
    dyn = [events[0]] + [dataclasses.replace(ev, expected_length=x) for ev, x in zip(events[1:], (2.5, 3.0, 4.0))]
    fig = plots.accepted_length_figure(dyn)
    t = by_name(fig)
    assert list(t["expected (dynamic tree)"].y) == [2.5, 3.0, 4.0]
    assert list(t["tree size (nodes)"].y) == [7, 7, 7] and t["tree size (nodes)"].yaxis == "y2"
    assert "forecast missed by 0.50 tokens a round" in fig.layout.title.text


def test_the_chart_shows_the_tree_shrink_when_the_temperature_rises():
    """The embedded model with its trained heads: a live slider change from greedy to T = 1.2 shrinks
    the next rounds' dynamic trees, and the chart's size line shows it."""
    loaded = specdec.load()
    loaded.engine.set_cost_model(specdec.cost.CostModel((1, 16, 64), (1e-3, 1.2e-3, 2e-3), 2e-4, 1e-4))
    params = [specdec.SamplingParams(temperature=0.0, seed=3)]
    ids = loaded.tokenizer("class Stack:\n    def __init__(self):").input_ids
    events = []
    for ev in loaded.engine.stream(ids, 200, lambda: params[0], tree="auto", eos_token_id=None):
        events.append(ev)
        if ev.index == 20:
            params[0] = params[0].replace(temperature=1.2)
    sizes = by_name(plots.accepted_length_figure(events))["tree size (nodes)"].y
    xs = [ev.index for ev in events[1:]]
    before = [s for x, s in zip(xs, sizes) if 5 < x <= 20]
    after = [s for x, s in zip(xs, sizes) if x > 25]
    print(f"\nmean tree size: greedy {sum(before) / len(before):.1f}, T = 1.2 {sum(after) / len(after):.1f}")
    assert sum(after) / len(after) < 0.7 * sum(before) / len(before), (before, after)
