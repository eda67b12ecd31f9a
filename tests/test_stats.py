"""specdec/stats.py: the definitions every consumer shares, pinned on hand-made events."""
from __future__ import annotations

import pytest

from conftest import P0, lookup_event, node, plain_event, prefill_event, run_events, tree_event
from specdec import EmittedToken, RoundEvent
from specdec.stats import (DepthCounts, accepted_by_lookup, accepted_drafts, change_rounds, depth_counts,
                           mean_accepted_length, params_changed, percentile, percentiles, round_depths, rule_label,
                           summarize, throughput)


def test_mean_accepted_length_is_tokens_per_forward_after_the_prefill():
    assert mean_accepted_length(run_events()) == 3.0  # 3 tokens in each of 3 decoding rounds; prefill excluded
    assert mean_accepted_length([prefill_event()]) is None  # no decoding round yet
    plain = [prefill_event(kind="baseline")] + [plain_event(i) for i in range(1, 6)]
    assert mean_accepted_length(plain) == 1.0  # plain decoding scores exactly 1


def test_round_depths_and_per_depth_acceptance_state_the_denominator():
    assert round_depths(tree_event()) == (3, 2)  # tree reached depth 3, accepted 2 drafts
    assert round_depths(prefill_event()) == (0, 0) and round_depths(plain_event(1)) == (0, 0)
    shallow = RoundEvent(4, (node(1, "a", -1, 0, -1, None, None, "root"), node(2, "b", 0, 1, 0, 0.5, 0.9, "accepted")),
                         (0, 1), (EmittedToken(2, "b", "accepted", 0.5, 0.9),), dict(P0), "lossless", True,
                         {"total": 1.0}, 9)
    d = depth_counts(run_events() + [plain_event(4), shallow])
    # depth 1: 4 rounds reached it and all accepted; depth 3: 3 reached (the shallow tree did not), none accepted
    assert (d.reached, d.accepted) == ([4, 3, 3], [4, 3, 0])
    assert d.rates() == [1.0, 1.0, 0.0]
    assert d.given_previous() == [1.0, 0.75, 0.0]  # accepted at d / accepted at d-1: 3 of 4, though one tree stopped at 1
    assert [r["depth"] for r in d.rows()] == [1, 2, 3] and d.rows()[2]["reached"] == 3


def test_depth_counts_add_up_over_runs():
    a, b = DepthCounts(), DepthCounts()
    a.add(2, 1)
    b.add(4, 4)
    total = a + b
    assert (total.reached, total.accepted) == ([2, 2, 1, 1], [2, 1, 1, 1])
    assert (a.reached, a.accepted) == ([1, 1], [1, 0])  # addition leaves its operands alone
    assert total.given_previous() == [1.0, 0.5, 1.0, 1.0]
    assert DepthCounts().given_previous() == [] and DepthCounts(reached=[2], accepted=[0]).given_previous() == [0.0]


def test_percentile_is_nearest_rank():
    xs = [15, 20, 35, 40, 50]
    assert [percentile(xs, q) for q in (0, 5, 30, 40, 50, 100)] == [15, 15, 20, 20, 35, 50]
    assert percentile(list(range(1, 101)), 99) == 99 and percentile(list(range(1, 101)), 99.5) == 100
    assert percentile([], 50) is None
    assert percentiles([3.0, 1.0, 2.0]) == {"p50": 2.0, "p90": 3.0, "p99": 3.0}
    with pytest.raises(ValueError, match="`q`"):
        percentile(xs, 101)


def test_throughput_needs_a_positive_duration():
    assert throughput(10, 0.5) == 20.0
    assert throughput(10, 0.0) is None and throughput(10, None) is None


def test_summarize_totals():
    s = summarize(run_events(), wall_seconds=0.5)
    assert (s["rounds"], s["target_forwards"], s["new_tokens"], s["accepted_drafts"]) == (3, 4, 10, 6)
    assert s["mean_accepted_length"] == 3.0
    assert s["engine_seconds"] == pytest.approx(0.05)
    assert s["tokens_per_second"] == pytest.approx(10 / 0.05)  # the engine's own clocks
    assert s["wall_tokens_per_second"] == pytest.approx(20.0)
    assert s["changes"] == 1 and not s["lossy"] and s["rules"] == ["lossless"] and s["speculative"]
    assert summarize([])["new_tokens"] == 0 and summarize([])["finished"] is None


def test_lookup_drafts_are_counted_apart():
    assert accepted_by_lookup(lookup_event()) == 5 and accepted_by_lookup(tree_event()) == 0
    assert accepted_drafts(lookup_event()) == 5
    s = summarize([prefill_event(), tree_event(1), lookup_event()])
    assert s["accepted_drafts"] == 7 and s["lookup_drafts"] == 5 and s["lookup_rounds"] == 1


def test_lossy_rules_are_labelled_from_the_verifier():
    from specdec.verifier import ACCEPTANCE_RULES, LOSSY_RULES

    for rule in ACCEPTANCE_RULES:
        assert rule_label(rule).endswith("(LOSSY)") == (rule in LOSSY_RULES)
    typical = [RoundEvent(0, (), (), (), dict(P0), "typical", True, {"total": 1.0}, 0)]
    assert summarize(typical)["lossy"] is (("typical" in LOSSY_RULES))


def test_sampler_changes_between_rounds():
    assert change_rounds(run_events()) == [(3, {"temperature": (0.7, 1.2)})]
    assert params_changed(None, P0) == {}
    assert params_changed(P0, dict(P0, seed=9)) == {}  # the seed is no live setting


def test_tree_size_and_expected_length_error():
    import dataclasses

    from specdec.stats import expected_length_error, tree_size
    events = run_events()
    assert [tree_size(ev) for ev in events[1:]] == [7, 7, 7] and tree_size(plain_event(5)) == 1
    assert expected_length_error(events) is None and summarize(events)["expected_length_error"] is None
    # the verifier produced 3 tokens per round (path of 3 nodes); the policy expected 2.5, 3.0 and 4.0
    dyn = [events[0]] + [dataclasses.replace(ev, expected_length=x) for ev, x in zip(events[1:], (2.5, 3.0, 4.0))]
    assert expected_length_error(dyn) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    s = summarize(dyn)
    assert s["expected_length_error"] == pytest.approx(0.5) and s["mean_tree_nodes"] == 7
