"""Plot builders: pure functions from round events (or sampler rows) to Plotly figures: the per-run
charts and the sampler view, with the helpers and palette every figure shares. The draft tree of a
round has its own module, components/draft_tree_figure.py, built on these.

Token text reaches Plotly only through `label`, which HTML-escapes it
(Plotly renders a subset of HTML in text and hover labels) and makes
whitespace visible. Colours are hex, as Gradio's plotly.js 3 expects.

Each figure is written as plain trace and layout dicts, already in the form Plotly's validation
gives them (every trace with its "type", titles as {"text": ...}), and wrapped by `figure`
without that validation: about 0.6 ms a figure instead of 4-8 ms. The app builds five figures at
the end of every run, pure Python under the GIL, so with many users this is the server's largest
cost after Gradio itself. tests/test_plots_form.py checks that validation would change nothing.
"""
from __future__ import annotations

import html
from typing import Callable

import plotly.graph_objects as go
from gradio.components.plot import PlotData

from specdec import RoundEvent
from specdec.stats import (accepted_by_lookup, accepted_drafts, change_rounds, decode_rounds, depth_counts,
                           engine_seconds, expected_length_error, throughput, tree_size)

from .replay import drafter_name

STATUS_COLORS = {
    "root": "#455a64",
    "accepted": "#2e7d32",
    "rejected": "#c62828",
    "not_reached": "#bdbdbd",
}
TARGET_COLORS = {"correction": "#ef6c00", "bonus": "#1565c0", "baseline": "#757575"}
KEPT_COLOR = "#1565c0"
REMOVED_COLOR = "#cfcfcf"
CHANGE_COLOR = "#8e24aa"
LOOKUP_COLOR = "#00838f"  # prompt lookup: outline of its square nodes, its edges, its bars
LOOKUP_FILL = "#4db6ac"  # the accepted-length bars of prompt-lookup drafts
EMITTED_COLOR = "#ef6c00"  # the sampler view's outline of the token the run drew
CURRENT_COLOR = "#6a1b9a"  # the replayed round, in the charts
_VISIBLE_WS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def label(text: str, limit: int = 12) -> str:
    """Token text for a Plotly label: whitespace made visible, truncated, then HTML-escaped."""
    shown = "".join(_VISIBLE_WS.get(c, c) for c in text) or "∅"
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=False)


def prob_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def figure(data: list[dict], layout: dict) -> go.Figure:
    """A figure from trace and layout dicts in Plotly's validated form, skipping the validation (10x faster)."""
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def title_dict(text: str, size: int | None = None) -> dict:
    return {"text": text} if size is None else {"text": text, "font": {"size": size}}


def _hline(y: float, line: dict) -> dict:
    """A horizontal line across the plot at y (what `Figure.add_hline` makes)."""
    return {"type": "line", "line": line, "x0": 0, "x1": 1, "xref": "x domain", "y0": y, "y1": y, "yref": "y"}


def _vline(x: float, line: dict) -> dict:
    """A vertical line across the plot at x (what `Figure.add_vline` makes)."""
    return {"type": "line", "line": line, "x0": x, "x1": x, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain"}


def plot_data(fig: go.Figure) -> PlotData:
    """`fig` as `gr.Plot` sends it, serialized now: Plot.postprocess passes PlotData through, so a
    streamed run that re-sends the same figure in later updates pays Plotly's `to_json` (about 1 ms a
    figure here) once, not per update."""
    return PlotData(type="plotly", plot=fig.to_json())


def empty_figure(message: str, height: int = 260) -> go.Figure:
    note = {"text": html.escape(message), "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
            "font": {"size": 14, "color": "#616161"}}
    return figure([], {"annotations": [note], "height": height, "xaxis": {"visible": False},
                        "yaxis": {"visible": False}, "margin": dict(l=10, r=10, t=30, b=10), "plot_bgcolor": "#ffffff"})


# -- per-run charts --------------------------------------------------------------

def _changes(events: list[RoundEvent]) -> tuple[list[dict], list[dict]]:
    """Where the sampler settings changed mid-run: a dotted line and a ⚙ with the change as hover text."""
    shapes, notes = [], []
    for index, changes in change_rounds(events):
        what = ", ".join(f"{k} {a}→{b}" for k, (a, b) in changes.items())
        shapes.append(_vline(index - 0.5, dict(color=CHANGE_COLOR, dash="dot", width=1.5)))
        notes.append(dict(x=index - 0.5, y=1, yref="paper", text="⚙", showarrow=False,
                          hovertext=html.escape(f"round {index}: {what}"), font=dict(color=CHANGE_COLOR)))
    return shapes, notes


def _chart(data: list[dict], events: list[RoundEvent], title: str, ytitle: str, shapes: list[dict] = (),
           **layout) -> go.Figure:
    """A per-run chart: the shared layout, the settings changes marked, then `layout`'s own keys."""
    marks, notes = _changes(events)
    out = dict(title=title_dict(title, 13), height=300, barmode="stack", margin=dict(l=10, r=10, t=50, b=40),
               plot_bgcolor="#ffffff", uirevision="charts", legend=dict(orientation="h", y=-0.25),
               xaxis=dict(gridcolor="#eeeeee"), yaxis=dict(title=title_dict(ytitle), gridcolor="#eeeeee"))
    if [*shapes, *marks]:
        out["shapes"] = [*shapes, *marks]
    if notes:
        out["annotations"] = notes
    for key, value in layout.items():  # axes merge, as `update_layout` does
        out[key] = {**out[key], **value} if isinstance(value, dict) and key in out else value
    return figure(data, out)


def accepted_length_figure(events: list[RoundEvent], current: int | None = None) -> go.Figure:
    """Tokens per round, stacked: accepted drafts + the target's own token. The mean is drawn dashed;
    `current` (a round index, e.g. the replayed one) is shaded. Under the dynamic tree the policy's
    expected tokens ride along as a line, and the tree's size on a second axis: raise the
    temperature and both fall."""
    dec = decode_rounds(events)
    if not dec:
        return empty_figure("Accepted length per round: no decoding round yet.", 300)
    xs = [ev.index for ev in dec]
    drafts = [accepted_drafts(ev) for ev in dec]
    looked_up = [accepted_by_lookup(ev) for ev in dec]
    own = [len(ev.emitted) - d for ev, d in zip(dec, drafts)]
    if any(looked_up):  # the heads' share keeps its name, prompt lookup's share stacks on it
        heads = [d - k for d, k in zip(drafts, looked_up)]
        model = drafter_name(dec)
        data = [dict(type="bar", x=xs, y=heads, name=f"accepted drafts ({model})",
                     marker=dict(color=STATUS_COLORS["accepted"])),
                dict(type="bar", x=xs, y=looked_up, name="accepted drafts (prompt lookup)",
                     marker=dict(color=LOOKUP_FILL, line=dict(color=LOOKUP_COLOR, width=1)))]
    else:
        data = [dict(type="bar", x=xs, y=drafts, name="accepted drafts", marker=dict(color=STATUS_COLORS["accepted"]))]
    data.append(dict(type="bar", x=xs, y=own, name="target token", marker=dict(color=TARGET_COLORS["correction"])))
    mean = sum(len(ev.emitted) for ev in dec) / len(dec)
    shapes = [_hline(mean, dict(color="#212121", dash="dash", width=1))]
    if current is not None:
        shapes.append(dict(type="rect", x0=current - 0.5, x1=current + 0.5, xref="x", y0=0, y1=1, yref="y domain",
                           fillcolor=CURRENT_COLOR, opacity=0.15, line=dict(width=0)))
    title = (f"Accepted length per round: mean {mean:.2f}<br><sup>tokens per target forward, "
             f"n = {len(dec)} rounds (prefill excluded)</sup>")
    error = expected_length_error(events)
    if error is None:
        return _chart(data, events, title, "tokens", shapes)
    title = (f"Accepted length per round: mean {mean:.2f}<br><sup>the tree's forecast missed by {error:.2f} "
             "tokens a round<br>bars: tokens per target forward · line: forecast<br>grey: tree size (right axis)"
             "</sup>")
    return _chart(data + _dynamic_tree_traces(dec), events, title, "tokens", shapes, margin=dict(t=84),
                  yaxis2=dict(title=title_dict("nodes"), overlaying="y", side="right", rangemode="tozero", showgrid=False))


def _dynamic_tree_traces(dec: list[RoundEvent]) -> list[dict]:
    """The dynamic tree's expected tokens per round, and its size on a right-hand axis (y2)."""
    xs = [ev.index for ev in dec]
    return [dict(type="scatter", x=xs, y=[ev.expected_length for ev in dec], mode="lines+markers",
                 name="expected (dynamic tree)", line=dict(color="#212121", width=1.5), marker=dict(size=4),
                 hovertemplate="round %{x}: expected %{y:.2f} tokens<extra></extra>"),
            dict(type="scatter", x=xs, y=[tree_size(ev) for ev in dec], mode="lines", name="tree size (nodes)",
                 yaxis="y2", line=dict(color="#9e9e9e", width=1, shape="hv"),
                 hovertemplate="round %{x}: %{y} nodes<extra></extra>")]


def depth_acceptance_figure(events: list[RoundEvent]) -> go.Figure:
    """Acceptance rate per tree depth, with the denominator on every bar."""
    rows = depth_counts(events).rows()
    if not rows:
        return empty_figure("Acceptance per depth: no speculative round yet.", 300)
    bars = dict(
        type="bar", x=[r["depth"] for r in rows], y=[r["rate"] for r in rows], marker=dict(color=STATUS_COLORS["accepted"]),
        text=[f"{r['accepted']}/{r['reached']}" for r in rows], textposition="outside", name="accepted ÷ reached",
        customdata=[[r["accepted"], r["reached"], prob_text(r["given_prev"])] for r in rows],
        hovertemplate="depth %{x}: %{customdata[0]} of %{customdata[1]} rounds accepted a depth-%{x} draft"
                      "<br>given depth %{x}−1 accepted: %{customdata[2]}<extra></extra>")
    return _chart([bars], [], "Acceptance rate per depth<br><sup>accepted ÷ rounds whose tree had depth-d "
                              "drafts<br>(on each bar: the count over the denominator)</sup>", "rate", margin=dict(t=64),
                  yaxis=dict(range=[0, 1.15]), xaxis=dict(title=title_dict("depth d"), dtick=1), showlegend=False)


def throughput_figure(events: list[RoundEvent]) -> go.Figure:
    """Tokens/s per round and cumulative, from the engine's own timings (UI time excluded)."""
    if not events:
        return empty_figure("Tokens/s: no round yet.", 300)
    xs, per_round, cumulative = [], [], []
    toks, secs = 0, 0.0
    for ev in events:
        s = engine_seconds([ev])
        toks += len(ev.emitted)
        secs += s
        xs.append(ev.index)
        per_round.append(throughput(len(ev.emitted), s))
        cumulative.append(throughput(toks, secs))
    data = [dict(type="scatter", x=xs, y=per_round, mode="markers", name="this round",
                 marker=dict(color="#90caf9", size=6)),
            dict(type="scatter", x=xs, y=cumulative, mode="lines", name="cumulative", line=dict(color=KEPT_COLOR))]
    last = cumulative[-1]
    return _chart(data, events, f"Tokens/s: {'n/a' if last is None else f'{last:.1f}'} overall"
                                "<br><sup>engine time per round (UI excluded)</sup>", "tokens/s")


# -- the sampler view ------------------------------------------------------------

def sampler_figure(rows: list[dict], token_text: Callable[[int], str], params: dict, note: str = "",
                   emitted: int | None = None, emitted_prob: float | None = None) -> go.Figure:
    """Top tokens of the target distribution as horizontal bars; those the filters remove are grey.

    Labels read horizontally, with whitespace made visible (␣ ↵ ⇥). With `emitted`, the token the
    run actually drew at this position is outlined and starred (or named in the title when it lies
    outside the top rows).

    Args:
        rows: `specdec.sampler.filter_stages` output (prob = after temperature only).
        token_text: token id -> its text.
        params: the SamplingParams as a dict.
        note: one line under the title: where this position is.
        emitted: token id drawn at this position, if the run already drew it.
        emitted_prob: its target probability as the run saw it (the event's p), for the title.
    """
    if not rows:
        return empty_figure("Sampler view: type a prompt.", 300)
    labels = [label(token_text(r["token_id"]), 14) for r in rows]
    hit = next((i for i, r in enumerate(rows) if r["token_id"] == emitted), None)
    ticks = [("★ " + t) if i == hit else t for i, t in enumerate(labels)]
    kept = [i for i, r in enumerate(rows) if r["removed_by"] is None]
    gone = [i for i, r in enumerate(rows) if r["removed_by"] is not None]

    def custom(i):
        r = rows[i]
        return [label(token_text(r["token_id"]), 30), r["token_id"], prob_text(r["prob"]), prob_text(r["filtered_prob"]),
                ("removed by " + r["removed_by"].replace("_", "-")) if r["removed_by"] else "kept"]

    hover = ("<b>%{customdata[0]}</b> (id %{customdata[1]})<br>p after temperature %{customdata[2]}"
             "<br>p after filters %{customdata[3]}<br>%{customdata[4]}<extra></extra>")
    outline = lambda idx: dict(color=[EMITTED_COLOR if i == hit else "#ffffff" for i in idx],  # noqa: E731
                               width=[3 if i == hit else 0 for i in idx])
    data = [dict(type="bar", y=kept, x=[rows[i]["prob"] for i in kept], orientation="h", name="kept",
                 marker=dict(color=KEPT_COLOR, line=outline(kept)),
                 customdata=[custom(i) for i in kept], hovertemplate=hover),
            dict(type="bar", y=gone, x=[rows[i]["prob"] for i in gone], orientation="h", name="filtered out",
                 marker=dict(color=REMOVED_COLOR, line=outline(gone)),
                 customdata=[custom(i) for i in gone], hovertemplate=hover),
            dict(type="scatter", y=kept, x=[rows[i]["filtered_prob"] for i in kept], mode="markers",
                 name="after filters (renormalised)",
                 marker=dict(symbol="diamond", size=8, color="#ef6c00"), hoverinfo="skip")]
    t = params.get("temperature", 0)
    desc = "greedy (argmax)" if not t else (f"T={t:g} · top-k {params.get('top_k') or 'off'} · "
                                            f"top-p {params.get('top_p'):g} · min-p {params.get('min_p'):g}")
    drawn = ""
    if emitted is not None:
        pe = "" if emitted_prob is None else f" (p = {emitted_prob:.3f})"
        drawn = ("<br>★ = the token the run drew here" + pe if hit is not None else
                 f"<br>the run drew {label(token_text(emitted), 14)}{pe}, outside this top {len(rows)}")
    sub = desc + (f"<br>{html.escape(note)}" if note else "") + drawn
    return figure(data, dict(
        title=title_dict(f"The filters keep {len(kept)} of the {len(rows)} likeliest next tokens<br><sup>{sub}</sup>", 13),
        height=190 + 20 * len(rows), barmode="overlay", bargap=0.2, margin=dict(l=10, r=10, t=100, b=40),
        plot_bgcolor="#ffffff", uirevision="sampler", legend=dict(orientation="h", y=-0.12, yanchor="top"),
        yaxis=dict(tickmode="array", tickvals=list(range(len(rows))), ticktext=ticks, autorange="reversed",
                   tickfont=dict(family="ui-monospace, monospace", size=12), automargin=True),
        # log scale: a flat distribution over a large vocabulary and its renormalised top-k
        # differ by orders of magnitude, and both must stay visible.
        xaxis=dict(title=title_dict("probability (log)"), type="log", gridcolor="#eeeeee"),
    ))
