"""Round replay: which round to show, where to jump, and what each round did, in plain words.

Pure functions of round events (`events[i].index == i`: round 0 is the
prefill). The narration and the per-node rule read only what an event
carries: each node's target probability p under its parent's filtered law,
its status and its rank, so they explain *why* a draft was accepted or not.
"""
from __future__ import annotations

import re

from specdec import RoundEvent
from specdec.stats import accepted_by_lookup, accepted_drafts, rule_label


HIGHLIGHT_COLOR = "#6a1b9a"  # the current round's tokens: an outline in the ⚙ marker's purple


def drafter_name(events) -> str:
    """The model drafter of a run's (or a round's) drafts in words: "EAGLE-3" or "heads"."""
    return "EAGLE-3" if any(n.source == "eagle3" for ev in events for n in ev.nodes) else "heads"


def _q(text: str) -> str:
    """A token quoted for a sentence, whitespace made visible."""
    shown = text.replace("\n", "↵").replace("\t", "⇥")
    return "'" + (shown if shown.strip() else shown.replace(" ", "␣")) + "'" if shown else "''"


def _list(texts: list[str], limit: int = 6) -> str:
    shown = [_q(t) for t in texts[:limit]]
    if len(texts) > limit:
        shown.append(f"… ({len(texts) - limit} more)")
    return ", ".join(shown)


def _p(p: float | None, name: str = "p") -> str:
    """"p = 0.123" in a sentence, a tiny one said as such ("p < 0.001"), a missing one "p = n/a"."""
    if p is None:
        return f"{name} = n/a"
    return f"{name} = {p:.3f}" if p >= 0.001 else f"{name} < 0.001"


def node_rule(ev: RoundEvent, i: int) -> str:
    """Why node i of a round was accepted, rejected or never tried, under the round's acceptance rule."""
    n = ev.nodes[i]
    if n.status == "root":
        return "the last committed token (the round starts here)"
    if n.status == "not_reached":
        parent = ev.nodes[n.parent]
        if parent.status in ("rejected", "not_reached"):
            return "not tried: its parent was not accepted"
        return "not tried: a sibling was accepted first"
    p = n.target_prob
    verdict = "accepted" if n.status == "accepted" else "rejected"
    if ev.acceptance == "greedy":
        why = "it is the target's top token" if n.status == "accepted" else "it is not the target's top token"
        return f"{verdict}: {why} ({_p(p)})"
    if ev.acceptance == "typical":
        return (f"{verdict}: typical acceptance keeps x when p(x) > min(ε, δ·e^(−H(p))) ({_p(p)}; LOSSY rule)")
    # Lossless: the target draws its own token y from p at this position; a child is accepted when it
    # is y. Its chance beforehand is p(x): min(1, p/q) with q = 1, as the draft is a point mass.
    if p is None:
        return f"{verdict}"
    if n.status == "accepted":
        return f"{verdict}: the target's own draw here was this token (chance {_p(p, 'p(x)')}; the draft is a point mass)"
    return f"{verdict}: the target drew another token here (chance it would be this one: {_p(p, 'p(x)')})"


def narrate(ev: RoundEvent | None) -> str:
    """One or two plain sentences on what a round did."""
    if ev is None:
        return ""
    own = [t for t in ev.emitted if t.kind != "accepted"]
    if ev.index == 0:
        first = f" and picked the first token {_q(ev.emitted[0].text)}" if ev.emitted else ""
        cached = f" ({ev.prefix_cache_hit} of them reused from the prefix cache)" if ev.prefix_cache_hit else ""
        return (f"Round 0 is the prefill: the target read the {ev.prompt_tokens}-token prompt{cached} in one "
                f"forward{first}. Nothing was drafted yet.")
    if ev.extra.get("resumed"):  # see pace.py: a paced run resumed under the sliders' new settings
        tok = _q(own[-1].text) if own else "nothing"
        return (f"The sampler settings changed: the rounds made ahead of the view under the old ones were dropped, "
                f"and the target re-read the {ev.prompt_tokens}-token context in one forward and drew {tok} under "
                "the new ones. Drafting goes on from the next round.")
    if not ev.nodes:
        tok = _q(own[-1].text) if own else "nothing"
        return f"Plain decoding: one target forward, one token {tok}. No draft tree this round."
    drafts = [n for n in ev.nodes[1:]]
    by_lookup = sum(1 for n in drafts if n.source == "lookup")
    branches = sum(1 for n in drafts if n.parent == 0)
    model = {"heads": "The heads"}.get(drafter_name([ev]), "EAGLE-3")
    who = model if not by_lookup else ("Prompt lookup" if by_lookup == len(drafts) else
                                       f"{model} and prompt lookup ({by_lookup} copied)")
    first = (f"{who} proposed {len(drafts)} token{'s' if len(drafts) != 1 else ''} in {branches} "
             f"branch{'es' if branches != 1 else ''}.")
    path = [ev.nodes[i] for i in ev.accepted_path[1:]]
    agreed = (f"The target agreed with {_list([n.text for n in path])}" if path
              else "The target accepted none of the drafts")
    last = ev.accepted_path[-1] if ev.accepted_path else 0
    rejected = [n for n in ev.nodes if n.parent == last and n.status == "rejected"]
    tail = ""
    if own:
        tok = own[-1]
        if tok.kind == "correction":
            if rejected:
                worst = ", ".join(f"{_q(n.text)} (target {_p(n.target_prob)})" if n.target_prob is not None
                                  else _q(n.text) for n in rejected[:3])
                more = f" and {len(rejected) - 3} more" if len(rejected) > 3 else ""
                tail = f"; it rejected {worst}{more}, so it sampled a correction {_q(tok.text)}"
            else:
                tail = f", then sampled a correction {_q(tok.text)}"
        else:
            tail = f"; the whole path held, so it added a bonus token {_q(tok.text)} of its own"
    elif ev.finished:
        tail = " (the run ended inside this round)"
    second = f"{agreed}{tail}."
    elsewhere = sum(1 for n in ev.nodes if n.status == "rejected" and n.parent != last)
    if elsewhere:
        second += f" On the way it turned down {elsewhere} other guess{'es' if elsewhere > 1 else ''}."
    got = accepted_drafts(ev)
    return f"{first} {second} One forward, {len(ev.emitted)} token{'s' if len(ev.emitted) != 1 else ''} ({got} drafted)."


def has_rejection(ev: RoundEvent) -> bool:
    return any(n.status == "rejected" for n in ev.nodes)


def instructive_round(events: list[RoundEvent]) -> int:
    """The round most worth showing after a run: a long accepted path that also shows a rejection.

    Score: (accepted drafts, a rejection was visible, drafts reached by the verifier); ties go to
    the later round. Without any speculative round, the last round.
    """
    best, key = (len(events) - 1 if events else 0), None
    for ev in events:
        if ev.index == 0 or not ev.nodes:
            continue
        reached = sum(1 for n in ev.nodes if n.status in ("accepted", "rejected"))
        k = (accepted_drafts(ev), has_rejection(ev), reached)
        if key is None or k >= key:
            best, key = ev.index, k
    return best


def longest_accept(events: list[RoundEvent]) -> int:
    """The (first) round that accepted the most drafts; 0 when none accepted any."""
    best, most = 0, 0
    for ev in events:
        n = accepted_drafts(ev)
        if n > most:
            best, most = ev.index, n
    return best


def next_rejection(events: list[RoundEvent], current: int) -> int:
    """The next round after `current` (wrapping around) in which the target rejected a draft."""
    n = len(events)
    for step in range(1, n + 1):
        ev = events[(current + step) % n]
        if has_rejection(ev):
            return ev.index
    return current


def highlight_css(index: int | None) -> str:
    """A style tag that outlines round `index`'s tokens in the token stream (and its ⚙ marker)."""
    if index is None:
        return ""
    return (f'<style>#tokens .sd-tok[data-round="{int(index)}"]{{outline:2px solid {HIGHLIGHT_COLOR};'
            f"outline-offset:-1px}}</style>")


def _code(text: str) -> str:
    return "`" + repr(text).replace("`", "ˋ") + "`"


def _md_escape(text: str) -> str:
    """Plain text (token texts included) safe inside Markdown: `_` or `*` in a token is no emphasis."""
    return re.sub(r"([\\`*_{}\[\]<>#+!|~])", r"\\\1", text)


def round_markdown(ev: RoundEvent | None) -> str:
    """One round in plain words (the narration), then its technical line."""
    if ev is None:
        return ""
    p = ev.params
    sampler = "greedy" if not p.get("temperature") else \
        f"T={p['temperature']:g}, top-k {p['top_k'] or 'off'}, top-p {p['top_p']:g}, min-p {p['min_p']:g}"
    rule = rule_label(ev.acceptance)
    t = ev.timings
    times = ", ".join(f"{k} {t[k]:.1f} ms" for k in ("draft", "forward", "rows", "verify", "total") if k in t)
    head = "prefill" if ev.index == 0 else f"{len(ev.nodes) - 1 if ev.nodes else 0} drafts"
    looked_up = sum(1 for n in ev.nodes if n.source == "lookup")
    if looked_up:
        head += f", {looked_up} by prompt lookup, {accepted_by_lookup(ev)} of them accepted"
    toks = ", ".join(f"{_code(t.text)} {'first' if ev.index == 0 and t.kind == 'bonus' else t.kind}"
                     for t in ev.emitted)
    return (f"**Round {ev.index}** · {_md_escape(narrate(ev))}  \n"
            f"<small>{head} · rule {rule} · sampler {sampler} · emitted: {toks} · {times}"
            + (f" · finished: {ev.finished}" if ev.finished else "") + "</small>")
