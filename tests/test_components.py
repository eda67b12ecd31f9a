"""UI components from synthetic round events: plots, token rendering, stats, session state, handlers."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr
import plotly.graph_objects as go
import pytest
import torch

import specdec
from components import plots
from components.handlers import Handlers, Throttle, round_markdown
from components.session import Session, Settings, params_changed
from components.stats import accepted_by_lookup, change_rounds, depth_acceptance, stats_markdown, summarize
from components.tokens import KIND_COLORS, legend_html, render_round, render_tokens
from specdec import EmittedToken, RoundEvent, TreeNode
from specdec.lookup import DEFAULT_LOOKUP

P0 = {"temperature": 0.7, "top_k": 50, "top_p": 0.95, "min_p": 0.0, "seed": 1}


def node(tok, text, parent, depth, rank, q, p, status, source="heads"):
    return TreeNode(tok, text, parent, depth, rank, q, p, status, "root" if parent < 0 else source)


def tree_event(index: int = 1, params: dict | None = None) -> RoundEvent:
    """root -> ' fib' (accepted) -> '(n' (accepted) -> '):' (rejected); a correction '\\n' follows.

    Node ids: 0 root, 1 ' fib' (d1 r0, accepted), 2 '<b>' (d1 r1, not reached), 3 '(' (d2 r0, rejected),
    4 '(n' (d2 r1, accepted), 5 '):' (d3 r0, rejected), 6 'x' (d2 r0 under node 2, not reached).
    """
    nodes = (
        node(10, "def", -1, 0, -1, None, None, "root"),
        node(11, " fib", 0, 1, 0, 0.6, 0.7, "accepted"),
        node(12, "<b>", 0, 1, 1, 0.2, None, "not_reached"),
        node(13, "(", 1, 2, 0, 0.5, 0.1, "rejected"),
        node(14, "(n", 1, 2, 1, 0.3, 0.8, "accepted"),
        node(15, "):", 4, 3, 0, 0.4, 0.05, "rejected"),
        node(16, "x", 2, 2, 0, 0.1, None, "not_reached"),
    )
    emitted = (EmittedToken(11, " fib", "accepted", 0.6, 0.7), EmittedToken(14, "(n", "accepted", 0.3, 0.8),
               EmittedToken(17, "\n", "correction", None, 0.5))
    return RoundEvent(index, nodes, (0, 1, 4), emitted, dict(params or P0), "lossless", True,
                      {"draft": 1.0, "forward": 8.0, "verify": 1.0, "total": 10.0}, 3 * index + 1)


def prefill_event(params: dict | None = None, kind: str = "bonus") -> RoundEvent:
    return RoundEvent(0, (), (), (EmittedToken(9, "x", kind, None, 0.9),), dict(params or P0),
                      "lossless", kind != "baseline", {"forward": 20.0, "total": 20.0}, 1, prompt_tokens=4)


def plain_event(index: int) -> RoundEvent:
    return RoundEvent(index, (), (0,), (EmittedToken(20 + index, "y", "baseline", None, 0.4),), dict(P0), "plain",
                      False, {"forward": 5.0, "total": 5.0}, index + 1)


def by_name(fig: go.Figure) -> dict[str, go.Scatter]:
    return {t.name: t for t in fig.data}


# -- the draft tree figure ---------------------------------------------------------

def test_tree_figure_nodes_statuses_and_colours():
    fig = plots.tree_figure(tree_event())
    traces = by_name(fig)
    expected = {"root (committed)": 1, "accepted": 2, "rejected": 2, "not reached": 2}
    for name, count in expected.items():
        assert len(traces[name].x) == count, name
    assert traces["accepted"].marker.color == plots.STATUS_COLORS["accepted"]
    assert traces["rejected"].marker.color == plots.STATUS_COLORS["rejected"]
    assert traces["not reached"].marker.color == plots.STATUS_COLORS["not_reached"]
    # node ids carried in the hover data, in status order
    assert [c[7] for c in traces["accepted"].customdata] == [1, 4]
    assert [c[7] for c in traces["rejected"].customdata] == [3, 5]
    assert sum(len(t.x) for n, t in traces.items() if n in expected) == 7


def test_tree_figure_edges_and_bold_accepted_path():
    fig = plots.tree_figure(tree_event())
    traces = by_name(fig)
    edges, path = traces["draft edges"], traces["accepted path"]
    assert list(edges.x).count(None) == 4  # 6 edges, 2 of them on the accepted path
    assert list(path.x).count(None) == 2
    assert path.line.width > edges.line.width
    # the accepted path goes root (depth 0) -> depth 1 -> depth 2
    assert [x for x in path.x if x is not None] == [0.0, 1.0, 1.0, 2.0]
    # the correction hangs off the last accepted node, dashed
    target = traces["target token (correction)"]
    assert target.marker.color == plots.TARGET_COLORS["correction"]
    assert target.x[0] == 3.0


def test_tree_figure_hover_has_rank_and_probs_and_labels_are_escaped():
    fig = plots.tree_figure(tree_event())
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


def test_tree_layout_centres_parents_between_children():
    ev = tree_event()
    xs, ys = plots.tree_layout(ev)
    assert xs == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 2.0]
    leaves = [3, 5, 6]
    assert len({ys[i] for i in leaves}) == 3
    assert ys[1] == pytest.approx((ys[3] + ys[4]) / 2)
    assert ys[3] > ys[4]  # rank 0 above rank 1
    xs2, ys2 = plots.tree_layout(ev, extra_child_of=4)  # the target's token gets a row of its own
    assert xs2[-1] == 3.0 and len(set(ys2[i] for i in (3, 5, 6, 7))) == 4
    assert ys2[4] == pytest.approx((ys2[5] + ys2[7]) / 2)


def lookup_event() -> RoundEvent:
    """Two head drafts under the root and, listed after them, an 8-token lookup chain grafted below the root.

    Node ids: 0 root, 1 'a' (d1 r0, rejected), 2 'b' (d1 r1, not reached), 3..10 the chain (rank -1):
    3..7 accepted, 8 rejected, 9 and 10 not reached. A correction follows node 7.
    """
    nodes = [node(10, "x", -1, 0, -1, None, None, "root"),
             node(11, "a", 0, 1, 0, 0.5, 0.1, "rejected"),
             node(12, "b", 0, 1, 1, 0.2, None, "not_reached")]
    for k in range(8):
        status = "accepted" if k < 5 else "rejected" if k == 5 else "not_reached"
        nodes.append(node(20 + k, f"t{k}", 0 if k == 0 else 2 + k, k + 1, -1, None,
                          0.9 if k <= 5 else None, status, "lookup"))
    emitted = tuple(EmittedToken(20 + k, f"t{k}", "accepted", None, 0.9) for k in range(5)) + \
        (EmittedToken(30, "!", "correction", None, 0.4),)
    return RoundEvent(1, tuple(nodes), (0, 3, 4, 5, 6, 7), emitted, dict(P0), "lossless", True,
                      {"draft": 1.0, "forward": 8.0, "verify": 1.0, "total": 10.0}, 7)


def test_tree_figure_draws_prompt_lookup_nodes_apart():
    ev = lookup_event()
    fig = plots.tree_figure(ev)
    lookup = [t for t in fig.data if t.name == "prompt lookup"]
    legend, data = lookup  # a legend-only entry, then the nodes
    assert legend.showlegend is not False and legend.x == (None,) and legend.marker.symbol == plots.LOOKUP_SYMBOL
    assert data.showlegend is False and data.legendgroup == legend.legendgroup == "lookup"
    assert [c[7] for c in data.customdata] == list(range(3, 11))
    assert data.marker.symbol == plots.LOOKUP_SYMBOL and data.marker.line.color == plots.LOOKUP_COLOR
    assert list(data.marker.color[:6]) == [plots.STATUS_COLORS["accepted"]] * 5 + [plots.STATUS_COLORS["rejected"]]
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
    assert "accepted 5 of 10 drafts<br><sup>(5 of 8 from prompt lookup)" in fig.layout.title.text
    assert "squares = prompt lookup" in fig.layout.title.text
    # deep trees: the axis reaches the chain's end and the correction after node 7, labels stay short
    assert fig.layout.xaxis.range[1] >= 8.5 and fig.layout.xaxis.dtick == 1


def test_tree_layout_puts_the_lookup_chain_on_top():
    ev = lookup_event()
    xs, ys = plots.tree_layout(ev)
    assert xs[3:] == [float(d) for d in range(1, 9)]
    assert ys[3] > ys[1] > ys[2]  # rank -1 (lookup) above rank 0 above rank 1
    assert len(set(ys[i] for i in (1, 2, 10))) == 3 and len(set(ys[3:])) == 1  # the chain is one row
    xs2, ys2 = plots.tree_layout(ev, extra_child_of=7)
    assert xs2[-1] == 6.0 and ys2[-1] < ys2[8]  # the correction below the chain's next node


def test_lookup_drafts_in_stats_tokens_and_charts():
    events = [prefill_event(), tree_event(1), lookup_event()]
    assert accepted_by_lookup(lookup_event()) == 5 and accepted_by_lookup(tree_event()) == 0
    s = summarize(events)
    assert s["accepted_drafts"] == 7 and s["lookup_drafts"] == 5 and s["lookup_rounds"] == 1
    assert "accepted drafts: 2 by heads, **5** by prompt lookup (which drafted in 1 of the rounds)" in stats_markdown(s)
    assert "prompt lookup" not in stats_markdown(summarize(run_events()))
    out = render_round(lookup_event())
    assert out.count("sd-lookup") == 5
    assert 'title="round 1 · accepted draft (prompt lookup) · draft q=- · target p=0.900"' in out
    assert "sd-lookup" not in render_round(tree_event())
    t = by_name(plots.accepted_length_figure(events))
    assert list(t["accepted drafts (heads)"].y) == [2, 0]
    assert list(t["accepted drafts (prompt lookup)"].y) == [0, 5]
    assert "sd-lookup" in legend_html()
    assert "10 drafts, 8 by prompt lookup, 5 of them accepted ·" in round_markdown(lookup_event())


def test_tree_figure_without_tree_says_why():
    for ev, words in ((prefill_event(), "prefill"), (plain_event(3), "plain decoding"), (None, "Generate")):
        fig = plots.tree_figure(ev)
        assert not fig.data
        assert words in fig.layout.annotations[0].text


def test_label_escapes_and_truncates():
    assert plots.label("<script>alert(1)</script>", 40) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert plots.label(" a\n") == "␣a↵"
    assert plots.label("") == "∅"
    assert plots.label("abcdefghijklmnop", 5) == "abcd…"


# -- charts ------------------------------------------------------------------------

def run_events() -> list[RoundEvent]:
    changed = dict(P0, temperature=1.2)
    return [prefill_event(), tree_event(1), tree_event(2), tree_event(3, changed)]


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
    rows = depth_acceptance(run_events())
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
    fig = plots.sampler_figure(rows, lambda i: {1: " a", 2: "<b", 3: "c", 4: "d"}[i], P0, 7)
    t = by_name(fig)
    assert list(t["kept"].y) == [0, 1] and t["kept"].marker.color == plots.KEPT_COLOR
    assert list(t["filtered out"].y) == [2, 3] and t["filtered out"].marker.color == plots.REMOVED_COLOR
    assert [c[4] for c in t["filtered out"].customdata] == ["removed by top-p", "removed by min-p"]
    # horizontal bars: labels read left to right, no rotated ticks, no tag on every filtered bar
    assert t["kept"].orientation == "h" and not t["filtered out"].text and fig.layout.xaxis.tickangle is None
    assert list(fig.layout.yaxis.ticktext) == ["␣a", "&lt;b", "c", "d"]
    assert "2 of top 4 kept" in fig.layout.title.text


def test_sampler_figure_from_real_filter_stages():
    from specdec.sampler import filter_stages
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    params = specdec.SamplingParams(temperature=1.0, top_k=3)
    rows = filter_stages(logits, params, top=6)
    fig = plots.sampler_figure(rows, str, params.to_dict(), 3)
    assert len(by_name(fig)["kept"].x) == 3 and len(by_name(fig)["filtered out"].x) == 3


# -- tokens ------------------------------------------------------------------------

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


# -- stats, settings, session --------------------------------------------------------

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


def test_settings_validate_names_the_bad_value():
    ok = Settings.validate(0.5, 10.0, 0.9, 0.1, 32.0, 3.0, "small", "typical", True, trees=["small"])
    assert ok.top_k == 10 and isinstance(ok.top_k, int) and ok.max_new_tokens == 32 and ok.seed == 3
    bad = [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=1.5), dict(top_k=-1), dict(top_p=0),
           dict(min_p=2), dict(max_new_tokens=0), dict(seed=-2), dict(acceptance="fast"), dict(tree="huge"),
           dict(temperature="hot"), dict(speculative="yes"), dict(lookup=-1), dict(lookup=65), dict(lookup=2.5),
           dict(lookup="ten"), dict(lookup=None), dict(lookup=True), dict(lookup_mode="both"), dict(lookup_mode=None)]
    base = dict(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=8, seed=0, tree="small",
                acceptance="lossless", speculative=True)
    for change in bad:
        with pytest.raises(ValueError, match=next(iter(change))):
            Settings.validate(**{**base, **change}, trees=["small"])


def test_greedy_rule_forces_temperature_zero():
    s = Settings(temperature=0.9, acceptance="greedy")
    assert s.sampling_params(5).greedy and s.sampling_params(5).seed == 5
    assert not Settings(temperature=0.9).sampling_params().greedy


def test_session_live_params_and_stop():
    session = Session()
    run = session.start_run("p", [1, 2], Settings(temperature=0.5, seed=7))
    stop = session.should_stop(run)
    assert session.live_params().temperature == 0.5 and session.live_params().seed == 7
    session.live = session.live.with_live(1.0, 5, 0.8, 0.1)
    assert session.live_params().temperature == 1.0 and session.live_params().top_k == 5
    assert not stop()
    session.request_stop()
    assert stop()
    newer = session.start_run("p", [1], Settings())
    assert session.run is newer and not session.should_stop(newer)()
    session.finish(newer)
    assert not session.running


def test_throttle():
    t = Throttle(60.0)
    assert t() and not t() and t(force=True)


# -- handlers on the embedded model (no server) ----------------------------------------

@pytest.fixture(scope="module")
def handlers() -> Handlers:
    return Handlers(specdec.load(device="cpu"), max_prompt_tokens=64, figure_interval=0.0, text_interval=0.0)


CONTROLS = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=10, seed=0, tree="chain",
                acceptance="lossless", speculative=True, lookup=DEFAULT_LOOKUP, lookup_mode="first", chat=False)


def race_controls(**change) -> list:
    """Compare's inputs: the controls less `speculative` (a race always runs both)."""
    return [v for k, v in {**CONTROLS, **change}.items() if k != "speculative"]


def test_handler_generate_matches_the_library(handlers):
    session = Session()
    updates = list(handlers.generate("def fibonacci(n):", *CONTROLS.values(), session))
    ref = specdec.generate(handlers.loaded, "def fibonacci(n):", max_new_tokens=10, tree="chain")
    final = updates[-1][-1]
    assert final["text"] == ref.text and final["finished"] == "length"
    assert [u[-1]["round"] for u in updates[:-1]] == list(range(len(ref.rounds)))
    assert isinstance(updates[-1][2], go.Figure) and isinstance(updates[-1][8], go.Figure)  # tree, sampler
    assert session.run.done and len(session.run.events) == len(ref.rounds)
    fig, info, event, _, style = handlers.show_round(1, session)
    assert 'data-round="1"' in style
    assert event["index"] == 1 and "Round 1" in info and "Round 1" in fig.layout.title.text
    assert handlers.show_round(999, session)[2]["index"] == len(ref.rounds) - 1


def test_handler_stop_and_live_tuning(handlers):
    session = Session()
    gen = handlers.generate("class Stack:", *{**CONTROLS, "max_new_tokens": 200}.values(), session)
    first = next(gen)
    assert first[-1]["round"] == 0
    handlers.sampler_view("class Stack:", 1.5, 7, 0.9, 0.05, "lossless", False, session)
    next(gen)
    assert session.run.events[-1].params["temperature"] == 1.5
    handlers.stop(session)
    rest = list(gen)
    assert rest[-1][-1]["finished"] == "stopped"
    assert len(session.run.events) <= 3
    assert "settings changed" in rest[-1][1]


def test_handler_bad_inputs_raise_gr_error(handlers):
    session = Session()
    for prompt, change in (("", {}), ("   ", {}), ("x " * 200, {}), ("ok", {"top_p": 0.0}),
                           ("ok", {"max_new_tokens": 10_000}), ("ok", {"tree": "nope"})):
        with pytest.raises(gr.Error):
            next(handlers.generate(prompt, *{**CONTROLS, **change}.values(), session))
    assert session.run is None


def test_handler_sampler_view_and_compare(handlers):
    session = Session()
    fig = handlers.sampler_view("def f(x):", 0.8, 5, 1.0, 0.0, "lossless", False, session)
    assert len(by_name(fig)["kept"].x) == 5
    cached = session.sampler_cache
    fig = handlers.sampler_view("def f(x):", 0.8, 3, 1.0, 0.0, "lossless", False, session)
    assert session.sampler_cache is cached and len(by_name(fig)["kept"].x) == 3  # cached logits, re-filtered
    assert not handlers.sampler_view("", 0.8, 3, 1.0, 0.0, "lossless", False, session).data
    out = list(handlers.compare("def f(x):", *race_controls(max_new_tokens=6), session))[-1]
    assert "identical" in out[0] and "Measured ratio" in out[0]
    assert out[1].count("sd-tok") == 6 and out[2].count("sd-baseline") == 6


def test_round_markdown():
    under = tree_event(2)
    under = replace(under, nodes=(under.nodes[0], replace(under.nodes[1], text="_x*"), *under.nodes[2:]))
    assert "'\\_x\\*'" in round_markdown(under)  # a token's `_` or `*` is no Markdown emphasis
    md = round_markdown(tree_event(2))
    assert "**Round 2**" in md and "6 drafts" in md and "correction" in md
    assert round_markdown(None) == ""


def test_fast_rounds_are_batched_into_fewer_updates(handlers):
    batched = Handlers(handlers.loaded, figure_interval=60.0, text_interval=60.0)
    updates = list(batched.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 12}.values(), Session()))
    assert len(updates) == 2  # the first round, then the final update with everything
    assert updates[-1][-1]["new_tokens"] == 12 and updates[-1][0].count("sd-tok") == 12
    assert isinstance(updates[0][2], go.Figure)  # figures come with the first update too


# -- prompt lookup on the embedded model -------------------------------------------------

def test_real_lookup_rounds_are_drawn_as_prompt_lookup(handlers):
    engine = handlers.loaded.engine
    ids = handlers.encode("def fibonacci(n):")
    for mode in ("first", "merge"):
        events = list(engine.stream(ids, 48, tree="auto", lookup=10, lookup_mode=mode))
        rounds = [ev for ev in events if any(n.source == "lookup" for n in ev.nodes)]
        assert rounds, f"no round drafted by prompt lookup ({mode})"
        ev = max(rounds, key=lambda e: len(e.nodes))
        looked_up = [i for i, n in enumerate(ev.nodes) if n.source == "lookup"]
        assert all(ev.nodes[i].rank == -1 and ev.nodes[i].draft_prob is None for i in looked_up)
        fig = plots.tree_figure(ev)
        data = [t for t in fig.data if t.name == "prompt lookup"][-1]
        assert [c[7] for c in data.customdata] == looked_up
        assert all(c[2] == "prompt lookup" and c[4] == "-" for c in data.customdata)
        others = [c[7] for t in fig.data if t.name in plots.STATUS_NAMES.values() for c in t.customdata]
        assert sorted(others + looked_up) == list(range(len(ev.nodes)))
        assert "from prompt lookup" in fig.layout.title.text
        xs, ys = plots.tree_layout(ev)
        top = max(n.depth for n in ev.nodes)
        assert top > 4 and fig.layout.xaxis.range[1] >= top + 0.5  # deeper than the heads' tree
        first = looked_up[0]  # the chain's first node is its parent's top child
        siblings = [i for i, n in enumerate(ev.nodes) if n.parent == ev.nodes[first].parent]
        assert ys[first] == max(ys[i] for i in siblings)
        if mode == "merge":
            assert any(n.source == "heads" for n in ev.nodes)
        assert sum(accepted_by_lookup(e) for e in events) > 0
        assert summarize(events)["lookup_drafts"] > 0


def test_handler_lookup_settings_and_errors(handlers):
    prompt = "def fibonacci(n):"
    session = Session()
    lookup_only = {**CONTROLS, "tree": "none", "lookup": 8, "lookup_mode": "merge", "max_new_tokens": 24}
    final = list(handlers.generate(prompt, *lookup_only.values(), session))[-1]
    ref = specdec.generate(handlers.loaded, prompt, max_new_tokens=24, tree="none", lookup=8, lookup_mode="merge")
    assert final[-1]["text"] == ref.text
    assert session.run.settings.lookup == 8 and session.run.settings.lookup_mode == "merge"
    assert all(n.source != "heads" for ev in session.run.events for n in ev.nodes)  # tree "none": lookup only
    assert "by prompt lookup" in final[1]
    # plain decoding ignores prompt lookup
    plain = list(handlers.generate(prompt, *{**lookup_only, "speculative": False, "lookup": 64}.values(),
                                   session))[-1]
    assert plain[-1]["text"] == ref.text and not any(ev.nodes for ev in session.run.events)
    assert {k for ev in session.run.events for k in (t.kind for t in ev.emitted)} == {"baseline"}
    for change, words in (({"lookup": 65}, "`lookup` must be in [0, 64]"), ({"lookup": 1.5}, "must be an integer"),
                          ({"lookup": "many"}, "`lookup` must be a number"),
                          ({"lookup_mode": "both"}, "`lookup_mode` must be one of ['first', 'merge']"),
                          ({"tree": "none", "lookup": 0}, "drafts nothing")):
        with pytest.raises(gr.Error, match="lookup|drafts nothing") as err:
            next(handlers.generate(prompt, *{**CONTROLS, **change}.values(), session))
        assert words in err.value.message, (change, err.value.message)
        with pytest.raises(gr.Error):
            next(handlers.compare(prompt, *race_controls(**change), session))
    # the tree "none" with speculation off needs no lookup
    out = list(handlers.generate(prompt, *{**CONTROLS, "tree": "none", "lookup": 0, "speculative": False}.values(),
                                 session))[-1]
    assert out[-1]["new_tokens"] == 10
    assert ("none (root only: prompt lookup drafts everything)", "none") in handlers.tree_choices


# -- replay, narration and the race: pure functions of events ------------------------------

def test_narration_says_what_the_round_did_and_the_rule_per_node():
    from components.replay import narrate, node_rule
    ev = tree_event(3)
    text = narrate(ev)
    assert "The heads proposed 6 tokens in 2 branches." in text
    assert "The target agreed with ' fib', '(n'; it rejected '):' (target p = 0.050), so it sampled a correction '↵'. On the way it " \
        "turned down 1 other guess." in text
    # Lossless: a draft is a point mass, so the first child tried is accepted with probability p(x) ...
    assert node_rule(ev, 1) == "accepted: accept with probability p(x) = 0.700 (the draft is a point mass: " \
                               "min(1, p/q), q = 1)"
    # ... and after a rejected sibling, with the renormalised residual r(x) = p / (1 - p(sibling)).
    assert "r(x) = p / (1 − 0.100) = 0.889" in node_rule(ev, 4)
    assert node_rule(ev, 2) == "not tried: a sibling was accepted first"
    assert node_rule(ev, 6) == "not tried: its parent was not accepted"
    greedy = RoundEvent(3, ev.nodes, ev.accepted_path, ev.emitted, dict(P0), "greedy", True, {}, 4)
    assert node_rule(greedy, 5) == "rejected: it is not the target's top token (p = 0.050)"
    assert narrate(prefill_event()).startswith("Round 0 is the prefill: the target read the 4-token prompt")
    assert "Plain decoding" in narrate(plain_event(2))
    # the tree's hover carries the same rule
    hover = [c[8] for c in by_name(plots.tree_figure(ev))["accepted"].customdata]
    assert hover[0].startswith("accepted:<br>accept with probability p(x) = 0.700")


def test_instructive_round_and_jumps():
    from components.replay import highlight_css, instructive_round, longest_accept, next_rejection
    one = tree_event(1)  # 2 drafts accepted, with rejections
    full = RoundEvent(2, tuple(replace(n, status="accepted" if n.status == "rejected" else n.status) for n in one.nodes),
                      one.accepted_path, one.emitted[:2], dict(P0), "lossless", True, {"total": 1.0}, 9)
    none = RoundEvent(3, one.nodes[:2] + (replace(one.nodes[1], status="rejected"),)[:0], (0,),
                      (EmittedToken(1, "a", "correction", None, 0.3),), dict(P0), "lossless", True, {}, 10)
    events = [prefill_event(), one, full, none, plain_event(4)]
    # The last round is plain and trivial; the most instructive is the one with the longest accept that
    # also shows a rejection (round 1 ties round 2 on accepted drafts but has rejected nodes).
    assert instructive_round(events) == 1
    assert longest_accept(events) == 1
    assert next_rejection(events, 1) == 1 and next_rejection(events, 4) == 1  # wraps around
    assert instructive_round([prefill_event(), plain_event(1)]) == 1
    assert 'data-round="7"' in highlight_css(7) and highlight_css(None) == ""


def race_lane(tokens_per_round: list[int], total_ms: float, forward_ms: float, nodes: int) -> list[RoundEvent]:
    events = [prefill_event()]
    for i, k in enumerate(tokens_per_round, start=1):
        emitted = tuple(EmittedToken(i, "t", "accepted" if j < k - 1 else "correction", None, 0.5) for j in range(k))
        tree = tuple(node(1, "t", -1 if j == 0 else 0, min(j, 1), j - 1, 0.5, 0.5, "root" if j == 0 else "rejected")
                     for j in range(nodes))
        events.append(RoundEvent(i, tree, (0,), emitted, dict(P0), "lossless", nodes > 0,
                                 {"forward": forward_ms, "total": total_ms}, i))
    return events


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


def test_sampler_figure_stars_the_emitted_token():
    rows = [{"token_id": 1, "prob": 0.5, "filtered_prob": 0.6, "removed_by": None},
            {"token_id": 2, "prob": 0.3, "filtered_prob": 0.4, "removed_by": None}]
    fig = plots.sampler_figure(rows, {1: " a", 2: "\n"}.get, P0, 7, emitted=2, emitted_prob=0.3)
    assert list(fig.layout.yaxis.ticktext) == ["␣a", "★ ↵"]
    assert by_name(fig)["kept"].marker.line.width == (0, 3)
    assert "★ = the token the run drew here (p = 0.300)" in fig.layout.title.text
    outside = plots.sampler_figure(rows, {1: " a", 2: "b", 9: "z"}.get, P0, 7, emitted=9)
    assert "the run drew z" in outside.layout.title.text and "outside this top 2" in outside.layout.title.text


def test_status_words_are_plain():
    s = summarize(run_events())
    for finished, words in (("length", "done: reached max new tokens"), ("context", "context window is full"),
                            ("eos", "the model ended the text")):
        line = stats_markdown({**s, "finished": finished})
        assert words in line and "status:" not in line
    assert "stopped by you" in stats_markdown({**s, "finished": None}, stopped=True)


# -- handlers: the model lock, chat, round views ------------------------------------------

def test_sampler_forwards_interleave_with_rounds_but_never_overlap(handlers, monkeypatch):
    """#10: the sampler view's forward takes the same model lock as each generation round."""
    import threading
    import time

    h = Handlers(handlers.loaded, figure_interval=0.0, text_interval=0.0)
    target = h.engine.target
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


def chat_loaded(handlers):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(specdec.api.DEFAULT_MODEL))
    tok.chat_template = ("{% for m in messages %}<|user|> {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    return specdec.load(handlers.loaded.model, heads=None, tokenizer=tok, device="cpu")


def test_chat_checkbox_follows_the_template_and_wraps_the_prompt(handlers):
    """#10: on by default with a chat template, greyed out without; its value reaches encode."""
    from app import build_demo

    def checkbox(loaded):
        demo = build_demo(loaded)
        return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "chat")

    plain = checkbox(handlers.loaded)  # the embedded model has no chat template
    assert plain.value is False and plain.interactive is False
    loaded = chat_loaded(handlers)
    box = checkbox(loaded)
    assert box.value is True and box.interactive is not False
    h = Handlers(loaded, figure_interval=0.0, text_interval=0.0)
    prompt = "write a loop"
    wrapped = specdec.api.encode(loaded, prompt, chat=True)
    assert wrapped != specdec.api.encode(loaded, prompt) and len(wrapped) > len(h.encode(prompt))
    controls = {**CONTROLS, "tree": "none", "lookup": 4, "max_new_tokens": 4}
    for chat, ids in ((True, wrapped), (False, h.encode(prompt))):
        session = Session()
        final = list(h.generate(prompt, *{**controls, "chat": chat}.values(), session))[-1]
        assert session.run.prompt_ids == ids and final[-1]["new_tokens"] == 4
    # Compare and the sampler view take it too
    session = Session()
    list(h.compare(prompt, *race_controls(tree="none", lookup=4, max_new_tokens=3, chat=True), session))
    assert session.active is None
    fig = h.sampler_view(prompt, 0.8, 5, 1.0, 0.0, "lossless", True, session)
    assert f"Next token #{len(wrapped)}" in fig.layout.title.text
    with pytest.raises(gr.Error, match="chat template"):
        next(handlers.generate(prompt, *{**CONTROLS, "chat": True}.values(), Session()))


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
    assert all(isinstance(s[5], go.Figure) for s in steps)


def test_final_update_shows_the_most_instructive_round_and_the_sampler_follows(handlers):
    from components.replay import instructive_round
    session = Session()
    updates = list(handlers.generate("def fibonacci(n):", *{**CONTROLS, "max_new_tokens": 24,
                                                             "tree": "default"}.values(), session))
    final = updates[-1]
    best = instructive_round(session.run.events)
    assert final[2].layout.title.text.startswith(f"Round {best}:") and f"**Round {best}**" in final[4]
    assert f'data-round="{best}"' in final[9]
    # the sampler view sits at the run's last token, starred
    ids = session.run.token_ids
    assert f"Next token #{len(session.run.prompt_ids) + len(ids) - 1}" in final[8].layout.title.text
    assert any(t.startswith("★") for t in final[8].layout.yaxis.ticktext)
    # after Clear it is back after the prompt
    cleared = handlers.clear("def fibonacci(n):", 0.0, 0, 1.0, 0.0, "lossless", False, session)
    assert "next token after the prompt" in cleared[8].layout.title.text
    assert "generated text" not in cleared[8].layout.title.text
    # the greedy rule greys out the temperature slider
    assert Handlers.temperature_control("greedy").interactive is False
    assert Handlers.temperature_control("lossless").interactive is True
