"""The draft-tree figure: one round's tree of drafts, laid out by depth, coloured by status.

Head drafts are circles, prompt-lookup drafts teal-outlined squares; the accepted path is bold and
the target's own token (a correction or a bonus) hangs off its end, dashed. Built like the other
figures (components/plots.py): token text through `plots.label`, plain dicts wrapped by `plots.figure`,
the shared palette from there.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from specdec import RoundEvent
from specdec.stats import rule_label

from .plots import LOOKUP_COLOR, STATUS_COLORS, TARGET_COLORS, empty_figure, figure, label, prob_text, title_dict
from .replay import node_rule

STATUS_NAMES = {"root": "root (committed)", "accepted": "accepted", "rejected": "rejected",
                "not_reached": "not reached"}
EDGE_COLOR = "#9e9e9e"
LOOKUP_SYMBOL = "square"
P_LABEL_DEPTH = 14  # trees at most this deep (the target's token included) show each draft's p: columns ~25 px on a phone


def _short(p: float) -> str:
    """A probability under a node's label: ".34", "1", "<.01"."""
    return "1" if p >= 0.995 else "<.01" if p < 0.005 else f"{p:.2f}".lstrip("0")


def _rule(event: RoundEvent, i: int) -> str:
    """The acceptance rule's verdict on node i, split over two hover lines."""
    return html.escape(node_rule(event, i), quote=False).replace(": ", ":<br>", 1)


def tree_layout(event: RoundEvent, extra_child_of: int | None = None) -> tuple[list[float], list[float]]:
    """x = depth; y from a tidy layout: leaves on separate rows, rank 0 on top, parents centred.

    Prompt-lookup nodes have rank -1, so a lookup chain is its parent's top child (the engine
    also tries it first). A chain is as deep as the lookup length, but adds only one leaf row.

    With `extra_child_of`, a virtual node (index N) is laid out as the last child of that node:
    the target's own token, which gets its own row instead of overlapping the drafts.
    """
    n = len(event.nodes)
    total = n + (extra_child_of is not None)
    kids: list[list[int]] = [[] for _ in range(total)]
    for i, node in enumerate(event.nodes):
        if node.parent >= 0:
            kids[node.parent].append(i)
    for c in kids:
        c.sort(key=lambda j: event.nodes[j].rank)
    xs = [float(node.depth) for node in event.nodes]
    if extra_child_of is not None:
        kids[extra_child_of].append(n)
        xs.append(xs[extra_child_of] + 1)
    ys = [0.0] * total
    next_row = [0]

    def place(i: int) -> float:  # recursion depth = tree depth: heads' depth + lookup length, < 80
        if not kids[i]:
            ys[i] = -float(next_row[0])
            next_row[0] += 1
        else:
            ys[i] = sum(place(c) for c in kids[i]) / len(kids[i])
        return ys[i]

    if n:
        place(0)
    return xs, ys


def _segments(pairs, xs, ys):
    ex, ey = [], []
    for a, b in pairs:
        ex += [xs[a], xs[b], None]
        ey += [ys[a], ys[b], None]
    return ex, ey


def tree_figure(event: RoundEvent | None) -> go.Figure:
    """The round's draft tree: nodes by status, the accepted path bold, the target's own token dashed.

    Head drafts are circles (one trace per status); prompt-lookup drafts are squares with a teal
    outline, coloured by status too, in one "prompt lookup" trace with its own legend entry."""
    if event is None:
        return empty_figure("No round yet: press Generate.")
    if not event.nodes:
        why = ("round 0 is the prefill: the target picks the first token" if event.index == 0 else
               "the sliders changed: the target re-read the context under the new settings, no draft tree"
               if event.extra.get("resumed") else
               "plain decoding (speculation off or no room left): one target forward per token, no draft tree")
        return empty_figure(f"Round {event.index}: {why}.")
    nodes = event.nodes
    path = list(event.accepted_path)
    extra = [t for t in event.emitted if t.kind != "accepted"]  # the target's own token, if any
    last = path[-1] if path else 0
    xs, ys = tree_layout(event, last if extra else None)
    on_path = set(zip(path, path[1:]))
    all_edges = [(n.parent, i) for i, n in enumerate(nodes) if n.parent >= 0]
    looked_up = [i for i, n in enumerate(nodes) if n.source == "lookup"]
    lookup_set = set(looked_up)
    depth = max(n.depth for n in nodes) + (1 if extra else 0)
    limit = 12 if depth <= 5 else max(4, 60 // depth)  # label length: deep lookup chains have narrow columns

    def text(i: int, bold: bool) -> str:
        return f"<b>{label(nodes[i].text, limit)}</b>" if bold else label(nodes[i].text, limit)
    data = []
    ex, ey = _segments([e for e in all_edges if e not in on_path and e[1] not in lookup_set], xs, ys)
    data.append(dict(type="scatter", x=ex, y=ey, mode="lines", name="draft edges", hoverinfo="skip",
                     line=dict(color=EDGE_COLOR, width=1), showlegend=False))
    if looked_up:
        lx, ly = _segments([e for e in all_edges if e not in on_path and e[1] in lookup_set], xs, ys)
        data.append(dict(type="scatter", x=lx, y=ly, mode="lines", name="lookup edges", hoverinfo="skip",
                         line=dict(color=LOOKUP_COLOR, width=1.5, dash="dot"), showlegend=False))
    ax, ay = _segments([e for e in all_edges if e in on_path], xs, ys)
    data.append(dict(type="scatter", x=ax, y=ay, mode="lines", name="accepted path", hoverinfo="skip",
                     line=dict(color=STATUS_COLORS["accepted"], width=5)))
    for status in ("root", "accepted", "rejected", "not_reached"):
        idx = [i for i, n in enumerate(nodes) if n.status == status and i not in lookup_set]
        if not idx:
            continue
        custom = [[label(nodes[i].text, 40), nodes[i].depth, max(nodes[i].depth - 1, 0), nodes[i].rank,
                   prob_text(nodes[i].draft_prob), prob_text(nodes[i].target_prob), nodes[i].token_id, i, _rule(event, i)]
                  for i in idx]
        who = ("EAGLE-3 · child rank %{customdata[3]}" if any(n.source == "eagle3" for n in nodes)
               else "head %{customdata[2]} rank %{customdata[3]}")
        hover = ("<b>%{customdata[0]}</b> (id %{customdata[6]}, node %{customdata[7]})<br>"
                 "depth %{customdata[1]} · " + who + "<br>"
                 "draft q = %{customdata[4]}<br>target p = %{customdata[5]}<br>%{customdata[8]}<extra>" +
                 STATUS_NAMES[status] + "</extra>")
        bold = status in ("root", "accepted")
        data.append(dict(
            type="scatter", x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers+text",
            name=STATUS_NAMES[status],
            text=[text(i, bold) for i in idx],
            textposition="top right", textfont=dict(size=11 if depth <= 5 else 10, color="#212121"),
            marker=dict(color=STATUS_COLORS[status], size=14 if bold else 10,
                        line=dict(color="#1b5e20" if bold else "#ffffff", width=2 if bold else 1)),
            customdata=custom, hovertemplate=hover,
        ))
    if looked_up:  # prompt lookup: squares with a teal outline, coloured by status like the head drafts
        data.append(dict(  # legend entry only: a point-coloured trace would show its first point's colour
            type="scatter", x=[None], y=[None], mode="markers", name="prompt lookup", legendgroup="lookup", hoverinfo="skip",
            marker=dict(symbol=LOOKUP_SYMBOL, color="#ffffff", size=11, line=dict(color=LOOKUP_COLOR, width=2))))
        acc = [nodes[i].status == "accepted" for i in looked_up]
        data.append(dict(
            type="scatter", x=[xs[i] for i in looked_up], y=[ys[i] for i in looked_up], mode="markers+text",
            name="prompt lookup",
            legendgroup="lookup", showlegend=False,
            text=[text(i, a) for i, a in zip(looked_up, acc)],
            textposition="top right", textfont=dict(size=11 if depth <= 5 else 10, color="#212121"),
            marker=dict(symbol=LOOKUP_SYMBOL, color=[STATUS_COLORS[nodes[i].status] for i in looked_up],
                        size=[13 if a else 10 for a in acc], line=dict(color=LOOKUP_COLOR, width=2)),
            customdata=[[label(nodes[i].text, 40), nodes[i].depth, "prompt lookup", "-", "-",
                         prob_text(nodes[i].target_prob), nodes[i].token_id, i, STATUS_NAMES[nodes[i].status],
                         _rule(event, i)] for i in looked_up],
            hovertemplate="<b>%{customdata[0]}</b> (id %{customdata[6]}, node %{customdata[7]})<br>"
                          "depth %{customdata[1]} · prompt lookup<br>draft q = -<br>"
                          "target p = %{customdata[5]}<br>%{customdata[9]}<extra>%{customdata[8]}</extra>",
        ))
    # Each draft's p under its label, small and grey, where the columns leave room (a phone shows no hover).
    with_p = [i for i, n in enumerate(nodes) if n.status != "root" and n.target_prob is not None]
    if with_p and depth <= P_LABEL_DEPTH:
        data.append(dict(type="scatter", x=[xs[i] for i in with_p], y=[ys[i] for i in with_p], mode="text",
                         name="p labels", text=[_short(nodes[i].target_prob) for i in with_p],
                         textposition="bottom right", textfont=dict(size=10, color="#616161"), hoverinfo="skip",
                         showlegend=False))
    # The target's own token after the accepted path: a correction or a bonus.
    if extra:
        tok = extra[-1]
        x_t, y_t = xs[-1], ys[-1]
        color = TARGET_COLORS.get(tok.kind, TARGET_COLORS["baseline"])
        data.append(dict(type="scatter", x=[xs[last], x_t], y=[ys[last], y_t], mode="lines", hoverinfo="skip",
                         line=dict(color=color, width=2, dash="dash"), showlegend=False))
        data.append(dict(
            type="scatter", x=[x_t], y=[y_t], mode="markers+text", name=f"target token ({tok.kind})",
            text=[f"<b>{label(tok.text, limit)}</b>"], textposition="middle right",
            marker=dict(color=color, size=15, symbol="diamond"),
            customdata=[[label(tok.text, 40), tok.kind, prob_text(tok.target_prob), tok.token_id]],
            hovertemplate="<b>%{customdata[0]}</b> (id %{customdata[3]})<br>%{customdata[1]} from the target"
                          "<br>target p = %{customdata[2]}<extra></extra>"))
    drafts = len(nodes) - 1
    got = len(path) - 1
    kind = extra[-1].kind if extra else "none"
    rule = rule_label(event.acceptance)
    leaves = int(round(-min(ys))) + 1  # leaf rows are 0, -1, -2, ...
    columns = ("columns = depth (EAGLE-3: one step each)" if any(n.source == "eagle3" for n in nodes)
               else "columns = depth (head = depth − 1)")
    sub = [f"then a {kind} token · rule {rule}", columns,
           "bold = accepted path" + (" · grey: p, the target's" if with_p and depth <= P_LABEL_DEPTH else "")]
    if looked_up:
        got_lookup = sum(1 for i in path if i in lookup_set)
        match = event.extra.get("lookup_match")  # the longer the n-gram it follows, the likelier the chain
        sub = [f"{got_lookup} of {len(looked_up)} from prompt lookup (squares)"
               + (f", {match}-gram match" if match else "")] + sub
    # Short lines, one fact each: a phone is about 50 characters wide, and Plotly does not wrap titles.
    height = int(min(1000, max(400, 26 * leaves + 220 + 15 * len(sub))))
    return figure(data, dict(
        # The title hangs 48 px from the top (below the panel's label); the margin leaves a band under its last
        # line for the depth ticks (on top).
        title={**title_dict(f"Round {event.index}: accepted {got} of {drafts} drafts<br><sup>{'<br>'.join(sub)}</sup>", 14),
               "x": 0.02, "xanchor": "left", "y": 1 - 48 / height, "yanchor": "top", "yref": "container"},
        height=height,
        margin=dict(l=10, r=10, t=86 + 15 * len(sub), b=20), plot_bgcolor="#ffffff", uirevision=f"tree-{len(nodes)}",
        xaxis=dict(dtick=1 if max(xs) <= 20 else 5, range=[-0.3, max(xs) + max(0.9, 0.08 * max(xs))], zeroline=False,
                   gridcolor="#eeeeee", side="top"),
        yaxis=dict(visible=False), hoverlabel=dict(align="left"),
        legend=dict(orientation="h", y=-0.02, yanchor="top", entrywidth=125, font=dict(size=11)),
    ))
