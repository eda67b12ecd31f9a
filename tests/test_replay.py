"""components/replay.py: which round to show and what each round did, in words."""
from __future__ import annotations

from dataclasses import replace

from components.draft_tree_figure import tree_figure
from components.handlers import round_markdown
from conftest import P0, by_name, plain_event, prefill_event, tree_event
from specdec import EmittedToken, RoundEvent


def test_round_markdown():
    under = tree_event(2)
    under = replace(under, nodes=(under.nodes[0], replace(under.nodes[1], text="_x*"), *under.nodes[2:]))
    assert "'\\_x\\*'" in round_markdown(under)  # a token's `_` or `*` is no Markdown emphasis
    md = round_markdown(tree_event(2))
    assert "**Round 2**" in md and "6 drafts" in md and "correction" in md
    assert round_markdown(None) == ""


def test_narration_says_what_the_round_did_and_the_rule_per_node():
    from components.replay import narrate, node_rule
    ev = tree_event(3)
    text = narrate(ev)
    assert "The heads proposed 6 tokens in 2 branches." in text
    assert "The target agreed with ' fib', '(n'; it rejected '):' (target p = 0.050), so it sampled a correction '↵'. On the way it " \
        "turned down 1 other guess." in text
    # Lossless: the target draws its own token from p and a child is accepted when it is that token;
    # its chance was p(x), the draft being a point mass.
    assert node_rule(ev, 1) == "accepted: the target's own draw here was this token (chance p(x) = 0.700; " \
                               "the draft is a point mass)"
    assert node_rule(ev, 5) == "rejected: the target drew another token here (chance it would be this one: p(x) = 0.050)"
    assert node_rule(ev, 2) == "not tried: a sibling was accepted first"
    assert node_rule(ev, 6) == "not tried: its parent was not accepted"
    greedy = RoundEvent(3, ev.nodes, ev.accepted_path, ev.emitted, dict(P0), "greedy", True, {}, 4)
    assert node_rule(greedy, 5) == "rejected: it is not the target's top token (p = 0.050)"
    assert narrate(prefill_event()).startswith("Round 0 is the prefill: the target read the 4-token prompt")
    assert "Plain decoding" in narrate(plain_event(2))
    # the tree's hover carries the same rule
    hover = [c[8] for c in by_name(tree_figure(ev))["accepted"].customdata]
    assert hover[0].startswith("accepted:<br>the target's own draw here was this token (chance p(x) = 0.700")


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


def test_a_tiny_probability_reads_as_less_than_a_thousandth_everywhere():
    from components.node_table import node_table_html
    from components.replay import narrate, node_rule

    ev = tree_event()
    nodes = list(ev.nodes)
    nodes[5] = replace(nodes[5], target_prob=1e-5)  # the rejected sibling
    ev = replace(ev, nodes=tuple(nodes))
    text = narrate(ev) + node_rule(ev, 5) + node_table_html(ev)
    assert "target p < 0.001" in text and "p(x) < 0.001" in node_rule(ev, 5)
    assert "= <" not in text and "0.000)" not in text
