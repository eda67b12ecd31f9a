"""components/draft_tree_figure.py: a round's draft tree (layout, statuses, prompt lookup, labels), from synthetic
events and from real prompt-lookup rounds."""
from __future__ import annotations

from dataclasses import replace

import pytest

from components import draft_tree_figure as dtf
from components.plots import LOOKUP_COLOR, STATUS_COLORS, TARGET_COLORS
from conftest import by_name, lookup_event, plain_event, prefill_event, tree_event
from specdec.stats import accepted_by_lookup, summarize


def test_tree_figure_nodes_statuses_and_colours():
    fig = dtf.tree_figure(tree_event())
    traces = by_name(fig)
    expected = {"root (committed)": 1, "accepted": 2, "rejected": 2, "not reached": 2}
    for name, count in expected.items():
        assert len(traces[name].x) == count, name
    assert traces["accepted"].marker.color == STATUS_COLORS["accepted"]
    assert traces["rejected"].marker.color == STATUS_COLORS["rejected"]
    assert traces["not reached"].marker.color == STATUS_COLORS["not_reached"]
    # node ids carried in the hover data, in status order
    assert [c[7] for c in traces["accepted"].customdata] == [1, 4]
    assert [c[7] for c in traces["rejected"].customdata] == [3, 5]
    assert sum(len(t.x) for n, t in traces.items() if n in expected) == 7


def test_tree_figure_edges_and_bold_accepted_path():
    fig = dtf.tree_figure(tree_event())
    traces = by_name(fig)
    edges, path = traces["draft edges"], traces["accepted path"]
    assert list(edges.x).count(None) == 4  # 6 edges, 2 of them on the accepted path
    assert list(path.x).count(None) == 2
    assert path.line.width > edges.line.width
    # the accepted path goes root (depth 0) -> depth 1 -> depth 2
    assert [x for x in path.x if x is not None] == [0.0, 1.0, 1.0, 2.0]
    # the correction hangs off the last accepted node, dashed
    target = traces["target token (correction)"]
    assert target.marker.color == TARGET_COLORS["correction"]
    assert target.x[0] == 3.0


def test_tree_figure_hover_has_rank_and_probs_and_labels_are_escaped():
    fig = dtf.tree_figure(tree_event())
    traces = by_name(fig)
    nr = traces["not reached"]
    i = [c[7] for c in nr.customdata].index(2)
    assert nr.text[i] == "&lt;b&gt;"  # '<b>' must not become markup
    assert nr.customdata[i][3] == 1  # rank
    assert nr.customdata[i][4] == "0.2000" and nr.customdata[i][5] == "n/a"  # draft q, target p
    assert "rank %{customdata[3]}" in nr.hovertemplate and "draft q" in nr.hovertemplate
    acc = traces["accepted"]
    assert acc.text[0] == "<b>␣fib</b>"  # accepted labels bold, whitespace made visible
    assert "accepted 2 of 6 drafts" in fig.layout.title.text


def test_tree_labels_each_draft_with_its_p_where_the_columns_fit(monkeypatch):
    """A phone has no hover: under each draft's label, its target probability p, small and grey."""
    ev = tree_event()
    fig = dtf.tree_figure(ev)
    p = by_name(fig)["p labels"]
    drafts = [i for i, n in enumerate(ev.nodes) if n.status != "root" and n.target_prob is not None]
    assert list(p.text) == [dtf._short(ev.nodes[i].target_prob) for i in drafts] and p.mode == "text"
    assert "grey: p, the target's" in fig.layout.title.text
    assert dtf._short(0.337) == ".34" and dtf._short(0.001) == "<.01" and dtf._short(0.999) == "1"
    monkeypatch.setattr(dtf, "P_LABEL_DEPTH", 1)  # a tree deeper than that: its columns are too narrow
    deep = dtf.tree_figure(ev)
    assert "p labels" not in by_name(deep) and "grey: p" not in deep.layout.title.text


def test_tree_layout_centres_parents_between_children():
    ev = tree_event()
    xs, ys = dtf.tree_layout(ev)
    assert xs == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 2.0]
    leaves = [3, 5, 6]
    assert len({ys[i] for i in leaves}) == 3
    assert ys[1] == pytest.approx((ys[3] + ys[4]) / 2)
    assert ys[3] > ys[4]  # rank 0 above rank 1
    xs2, ys2 = dtf.tree_layout(ev, extra_child_of=4)  # the target's token gets a row of its own
    assert xs2[-1] == 3.0 and len(set(ys2[i] for i in (3, 5, 6, 7))) == 4
    assert ys2[4] == pytest.approx((ys2[5] + ys2[7]) / 2)


def test_tree_figure_draws_prompt_lookup_nodes_apart():
    ev = lookup_event()
    fig = dtf.tree_figure(ev)
    lookup = [t for t in fig.data if t.name == "prompt lookup"]
    legend, data = lookup  # a legend-only entry, then the nodes
    assert legend.showlegend is not False and legend.x == (None,) and legend.marker.symbol == dtf.LOOKUP_SYMBOL
    assert data.showlegend is False and data.legendgroup == legend.legendgroup == "lookup"
    assert [c[7] for c in data.customdata] == list(range(3, 11))
    assert data.marker.symbol == dtf.LOOKUP_SYMBOL and data.marker.line.color == LOOKUP_COLOR
    assert list(data.marker.color[:6]) == [STATUS_COLORS["accepted"]] * 5 + [STATUS_COLORS["rejected"]]
    # hover: "prompt lookup" instead of a head and rank, q shown as "-"
    assert "prompt lookup" in data.hovertemplate and "head" not in data.hovertemplate
    assert data.customdata[0][2] == "prompt lookup" and data.customdata[0][4] == "-"
    assert data.customdata[0][8] == "accepted" and data.customdata[6][8] == "not reached"
    # the status traces keep the head drafts only
    traces = by_name(fig)
    assert [c[7] for c in traces["rejected"].customdata] == [1]
    assert [c[7] for c in traces["not reached"].customdata] == [2]
    assert "accepted" not in traces  # only lookup nodes were accepted
    assert list(traces["lookup edges"].x).count(None) == 3  # chain edges off the accepted path
    assert list(traces["accepted path"].x).count(None) == 5
    assert "accepted 5 of 10 drafts<br><sup>5 of 8 from prompt lookup (squares)<br>" in fig.layout.title.text
    # one short fact per line: a phone is about 50 characters wide and Plotly does not wrap titles
    lines = fig.layout.title.text.replace("<sup>", "").replace("</sup>", "").split("<br>")
    assert max(len(line) for line in lines) <= 60, lines
    # the n-gram the chain followed, when the engine says
    matched = dtf.tree_figure(replace(ev, extra={"lookup_match": 3})).layout.title.text
    assert "5 of 8 from prompt lookup (squares), 3-gram match<br>" in matched
    assert max(len(line) for line in matched.replace("<sup>", "").replace("</sup>", "").split("<br>")) <= 60
    # deep trees: the axis reaches the chain's end and the correction after node 7, labels stay short
    assert fig.layout.xaxis.range[1] >= 8.5 and fig.layout.xaxis.dtick == 1


def test_tree_layout_puts_the_lookup_chain_on_top():
    ev = lookup_event()
    xs, ys = dtf.tree_layout(ev)
    assert xs[3:] == [float(d) for d in range(1, 9)]
    assert ys[3] > ys[1] > ys[2]  # rank -1 (lookup) above rank 0 above rank 1
    assert len(set(ys[i] for i in (1, 2, 10))) == 3 and len(set(ys[3:])) == 1  # the chain is one row
    xs2, ys2 = dtf.tree_layout(ev, extra_child_of=7)
    assert xs2[-1] == 6.0 and ys2[-1] < ys2[8]  # the correction below the chain's next node


def test_tree_figure_without_tree_says_why():
    for ev, words in ((prefill_event(), "prefill"), (plain_event(3), "plain decoding"), (None, "Generate")):
        fig = dtf.tree_figure(ev)
        assert not fig.data
        assert words in fig.layout.annotations[0].text


def test_real_lookup_rounds_are_drawn_as_prompt_lookup(handlers):
    engine = handlers.loaded.engine
    ids = handlers.encode("def fibonacci(n):")
    for mode in ("first", "merge"):
        events = list(engine.stream(ids, 48, tree="default", lookup=10, lookup_mode=mode))
        rounds = [ev for ev in events if any(n.source == "lookup" for n in ev.nodes)]
        assert rounds, f"no round drafted by prompt lookup ({mode})"
        ev = max(rounds, key=lambda e: len(e.nodes))
        looked_up = [i for i, n in enumerate(ev.nodes) if n.source == "lookup"]
        assert all(ev.nodes[i].rank == -1 and ev.nodes[i].draft_prob is None for i in looked_up)
        fig = dtf.tree_figure(ev)
        data = [t for t in fig.data if t.name == "prompt lookup"][-1]
        assert [c[7] for c in data.customdata] == looked_up
        assert all(c[2] == "prompt lookup" and c[4] == "-" for c in data.customdata)
        others = [c[7] for t in fig.data if t.name in dtf.STATUS_NAMES.values() for c in t.customdata]
        assert sorted(others + looked_up) == list(range(len(ev.nodes)))
        assert "from prompt lookup" in fig.layout.title.text
        assert 1 <= ev.extra["lookup_match"] <= 3 and f"{ev.extra['lookup_match']}-gram match" in fig.layout.title.text
        xs, ys = dtf.tree_layout(ev)
        top = max(n.depth for n in ev.nodes)
        assert top > 4 and fig.layout.xaxis.range[1] >= top + 0.5  # deeper than the heads' tree
        first = looked_up[0]  # the chain's first node is its parent's top child
        siblings = [i for i, n in enumerate(ev.nodes) if n.parent == ev.nodes[first].parent]
        assert ys[first] == max(ys[i] for i in siblings)
        if mode == "merge":
            assert any(n.source == "heads" for n in ev.nodes)
        assert sum(accepted_by_lookup(e) for e in events) > 0
        assert summarize(events)["lookup_drafts"] > 0
