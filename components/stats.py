"""Numbers over a list of round events: mean accepted length, per-depth acceptance, tokens/s.

Pure functions of events; the plots and the stats line both read these, so
the chart and the text can never disagree. Round 0 is the prefill and is
not a decoding round: it counts for tokens and time, never for acceptance.
"""
from __future__ import annotations

from specdec import RoundEvent

from .session import params_changed


def decode_rounds(events: list[RoundEvent]) -> list[RoundEvent]:
    return [ev for ev in events if ev.index > 0]


def spec_rounds(events: list[RoundEvent]) -> list[RoundEvent]:
    """Rounds that verified a draft tree (plain rounds have no nodes)."""
    return [ev for ev in events if ev.index > 0 and ev.nodes]


def accepted_drafts(ev: RoundEvent) -> int:
    return sum(1 for t in ev.emitted if t.kind == "accepted")


def accepted_sources(ev: RoundEvent) -> list[str]:
    """Who drafted each accepted token the round emitted, in order: "heads" or "lookup".

    The emitted accepted tokens are the accepted path after the root, cut at EOS or
    max_new_tokens. A chain token merged into a matching head node counts for the heads.
    """
    n = accepted_drafts(ev)
    if not ev.nodes:
        return ["heads"] * n
    return [ev.nodes[i].source for i in ev.accepted_path[1 : 1 + n]]


def accepted_by_lookup(ev: RoundEvent) -> int:
    """Accepted tokens of this round that prompt lookup drafted."""
    return sum(1 for s in accepted_sources(ev) if s == "lookup")


def lookup_nodes(ev: RoundEvent) -> int:
    return sum(1 for n in ev.nodes if n.source == "lookup")


def depth_acceptance(events: list[RoundEvent]) -> list[dict]:
    """Per tree depth d: how many speculative rounds had depth-d drafts, and in how many one was accepted.

    rate = accepted / reached, where reached counts the speculative rounds
    whose tree had nodes at depth d (trees shrink near max_new_tokens).
    `given_prev` conditions on depth d-1 having been accepted.
    """
    reached: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for ev in spec_rounds(events):
        top = max(n.depth for n in ev.nodes)
        got = len(ev.accepted_path) - 1
        for d in range(1, top + 1):
            reached[d] = reached.get(d, 0) + 1
            accepted[d] = accepted.get(d, 0) + (1 if got >= d else 0)
    rows = []
    for d in sorted(reached):
        prev = reached[d] if d == 1 else accepted.get(d - 1, 0)
        rows.append({"depth": d, "reached": reached[d], "accepted": accepted[d],
                     "rate": accepted[d] / reached[d],
                     "given_prev": (accepted[d] / prev) if prev else None})
    return rows


def change_rounds(events: list[RoundEvent]) -> list[tuple[int, dict]]:
    """[(round index, {key: (old, new)})] for every round whose sampler settings differ from the round before."""
    out, prev = [], None
    for ev in events:
        ch = params_changed(prev, ev.params)
        if ch:
            out.append((ev.index, ch))
        prev = ev.params
    return out


def summarize(events: list[RoundEvent], wall_seconds: float | None = None) -> dict:
    """Totals for the stats line. Mean accepted length = tokens per target forward over decoding rounds."""
    dec = decode_rounds(events)
    new = sum(len(ev.emitted) for ev in events)
    engine_s = sum(ev.timings.get("total", 0.0) for ev in events) / 1e3
    rules = sorted({ev.acceptance for ev in dec}) or sorted({ev.acceptance for ev in events})
    return {
        "rounds": len(dec),
        "new_tokens": new,
        "accepted_drafts": sum(accepted_drafts(ev) for ev in dec),
        "lookup_drafts": sum(accepted_by_lookup(ev) for ev in dec),  # of accepted_drafts
        "lookup_rounds": sum(1 for ev in dec if lookup_nodes(ev)),  # rounds that drafted by prompt lookup
        "mean_accepted_length": (sum(len(ev.emitted) for ev in dec) / len(dec)) if dec else None,
        "engine_seconds": engine_s,
        "tokens_per_second": new / engine_s if engine_s > 0 else None,
        "wall_tokens_per_second": new / wall_seconds if wall_seconds else None,
        "finished": events[-1].finished if events else None,
        "rules": rules,
        "lossy": "typical" in rules,
        "speculative": bool(events and events[0].speculative),
        "changes": len(change_rounds(events)),
    }


def _fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


FINISHED_WORDS = {  # the engine's `finished` values, as a reader would say them
    "eos": "done: the model ended the text",
    "length": "done: reached max new tokens",
    "context": "done: the model's context window is full",
}


def status_words(finished: str | None, stopped: bool = False) -> str:
    if stopped and not finished:
        return "stopped by you"
    return FINISHED_WORDS.get(finished, finished) if finished else "running…"


def stats_markdown(s: dict, stopped: bool = False) -> str:
    """One Markdown line for the stats box."""
    if not s["new_tokens"]:
        return ""
    rule = ", ".join(r + (" (LOSSY)" if r == "typical" else "") for r in s["rules"])
    status = status_words(s["finished"], stopped)
    parts = [
        f"**{s['new_tokens']}** tokens in **{s['rounds']}** decoding rounds",
        f"mean accepted length **{_fmt(s['mean_accepted_length'])}** tokens/target forward "
        f"(over {s['rounds']} rounds, prefill excluded)",
        f"**{_fmt(s['tokens_per_second'], 1)}** tok/s (engine time)",
        *([f"accepted drafts: {s['accepted_drafts'] - s['lookup_drafts']} by heads, "
           f"**{s['lookup_drafts']}** by prompt lookup (which drafted in {s['lookup_rounds']} of the rounds)"]
          if s.get("lookup_rounds") else []),
        f"rule: {rule}",
        f"**{status}**",
    ]
    if s["changes"]:
        parts.append(f"settings changed {s['changes']}×")
    return " · ".join(parts)
