"""The shown round's nodes as a table: every node's token, depth, drafter, q, p and verdict, without hover.

A pure function of one RoundEvent; the verdict's reason is `replay.node_rule`, the words the tree's hover uses.
"""
from __future__ import annotations

import html

from specdec import RoundEvent

from .plots import label
from .replay import node_rule

_VERDICT = {"root": "root", "accepted": "✓ accepted", "rejected": "✗ rejected", "not_reached": "· not tried"}
_SOURCE = {"eagle3": "EAGLE-3", "heads": "heads", "lookup": "lookup", "root": "root"}


def _prob(x: float | None) -> str:
    return "–" if x is None else ("< 0.001" if x < 0.001 else f"{x:.3f}")


def node_table_html(ev: RoundEvent | None) -> str:
    """An HTML table of the round's nodes in tree order (root first); a line of words for a round without one."""
    if ev is None:
        return '<div class="sd-nodes-empty">Each node of the shown round\'s tree is listed here.</div>'
    if not ev.nodes:
        why = ("the prefill" if ev.index == 0 else "the target re-read the context under the new settings"
               if ev.extra.get("resumed") else "plain decoding")
        return f'<div class="sd-nodes-empty">Round {ev.index} drafted nothing: {why}.</div>'

    rows = []
    for i, n in enumerate(ev.nodes):
        reason = node_rule(ev, i).split(": ", 1)
        why = html.escape(reason[-1] if len(reason) > 1 else "", quote=False)
        rows.append(f'<tr class="sd-node-{n.status}"><td>{i}</td><td class="sd-node-tok">{label(n.text, 24)}</td>'
                    f"<td>{n.depth}</td><td>{_SOURCE.get(n.source, n.source)}</td><td>{_prob(n.draft_prob)}</td>"
                    f"<td>{_prob(n.target_prob)}</td><td>{_VERDICT[n.status]}</td><td>{why}</td></tr>")
    head = ("<tr><th>#</th><th>token</th><th>depth</th><th>drafter</th><th title=\"the drafter's probability\">q</th>"
            "<th title=\"the target's probability under its parent's law\">p</th><th>verdict</th><th>why</th></tr>")
    return (f'<div class="sd-nodes"><table><caption>Round {ev.index}: {len(ev.nodes) - 1} drafts · '
            f"q = drafter's probability, p = target's</caption><thead>{head}</thead><tbody>{''.join(rows)}"
            "</tbody></table></div>")
