"""The coloured token stream: escaped HTML spans with a hover title per token.

The stream is append-only (no wrapper element, the container's CSS class
comes from `gr.HTML(elem_classes=...)`), so each streamed update only adds
the new round's spans and Gradio can send it as an "append" diff.
"""
from __future__ import annotations

import html

from specdec import RoundEvent
from specdec.stats import accepted_sources, params_changed


KIND_LABELS = {
    "accepted": "accepted draft",
    "correction": "correction (target resampled)",
    "bonus": "bonus (target, after a full path)",
    "baseline": "baseline (plain decoding)",
    "first": "first token (the target's, after the prompt)",
}
KIND_COLORS = {  # background colours; the same hues as the tree plot
    "accepted": "#c8e6c9",
    "correction": "#ffe0b2",
    "bonus": "#bbdefb",
    "baseline": "#e0e0e0",
    "first": "#e1bee7",
}


def _prob(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def token_title(round_index: int, kind: str, draft_prob: float | None, target_prob: float | None,
                source: str = "heads") -> str:
    """The hover title of one token. A prompt-lookup draft has no q (it is a point mass): "-"."""
    what = KIND_LABELS.get(kind, kind)
    if source == "lookup":
        return f"round {round_index} · {what} (prompt lookup) · draft q=- · target p={_prob(target_prob)}"
    return f"round {round_index} · {what} · draft q={_prob(draft_prob)} · target p={_prob(target_prob)}"


def _format_change(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {old}→{new}" for k, (old, new) in changes.items())


def render_round(event: RoundEvent, prev_params: dict | None = None) -> str:
    """HTML spans for one round's emitted tokens, preceded by a marker if the settings changed."""
    out = []
    changes = params_changed(prev_params, event.params)
    if changes:
        title = html.escape(f"settings changed before round {event.index}: {_format_change(changes)}", quote=True)
        out.append(f'<span class="sd-change" data-round="{event.index}" title="{title}">⚙</span>')
    sources = iter(accepted_sources(event))  # the accepted tokens come first, in path order
    for tok in event.emitted:
        kind = tok.kind if tok.kind in KIND_COLORS else "baseline"
        if event.index == 0 and event.speculative:
            kind = "first"  # the prefill's token: no draft path came before it, so it is no "bonus"
        source = next(sources, "heads") if tok.kind == "accepted" else "target"
        title = html.escape(token_title(event.index, kind, tok.draft_prob, tok.target_prob, source), quote=True)
        classes = (f"sd-tok sd-{kind}" + (" sd-lookup" if source == "lookup" else "")
                   + (" sd-nl" if "\n" in tok.text else "") + ("" if tok.text else " sd-partial"))
        out.append(f'<span class="{classes}" data-round="{event.index}" title="{title}">'
                   f"{html.escape(tok.text, quote=False)}</span>")
    return "".join(out)


def render_tokens(events: list[RoundEvent]) -> str:
    """The whole stream: `render_round` over every event, tracking settings changes."""
    parts, prev = [], None
    for ev in events:
        parts.append(render_round(ev, prev))
        prev = ev.params
    return "".join(parts)


LEGEND_NAMES = {"accepted": "accepted draft", "correction": "correction", "bonus": "bonus", "first": "first token",
                "baseline": "plain decoding"}  # short: the legend sits under the tokens, also on a phone


def legend_html(kinds=("accepted", "correction", "bonus", "first", "baseline")) -> str:
    items = "".join(f'<span class="sd-tok sd-{k}" title="{html.escape(KIND_LABELS[k], quote=True)}">'
                    f"{html.escape(LEGEND_NAMES[k])}</span>" for k in kinds)
    items += ('<span class="sd-tok sd-accepted sd-lookup" title="an accepted draft that prompt lookup proposed">'
              "from prompt lookup</span>")
    return (f'<div class="sd-legend"><b>Who wrote each token:</b> {items}'
            f'<span class="sd-change">⚙</span> settings changed · click or tap a token for its details and '
            f"its round</div>")
