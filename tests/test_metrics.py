"""Metrics move as expected after one generation; mean accepted length is derivable from counters."""
from __future__ import annotations

import specdec
from specdec.metrics import Metrics

from conftest import make_model


def _value(m: Metrics, name: str, labels: dict | None = None) -> float:
    v = m.registry.get_sample_value(name, labels or {})
    return 0.0 if v is None else v


def test_counters_after_one_generation():
    model = make_model("llama", seed=5)
    loaded = specdec.load(model, heads="random")
    m = Metrics()
    res = specdec.generate(loaded, prompt_ids=[1, 2, 3, 4], max_new_tokens=30, tree="small", on_round=m.observe_round)
    decode = [r for r in res.rounds if r.index > 0]
    assert _value(m, "specdec_rounds_total") == len(decode)
    emitted = sum(_value(m, "specdec_emitted_tokens_total", {"kind": k}) for k in ("accepted", "correction", "bonus"))
    assert emitted == sum(len(r.emitted) for r in decode)
    # mean accepted length from counters == the engine's own statistic
    assert abs(emitted / _value(m, "specdec_rounds_total") - res.stats["mean_accepted_length"]) < 1e-9
    accepted = sum(len(r.accepted_path) - 1 for r in decode)
    assert _value(m, "specdec_accepted_tokens_total") == accepted
    per_depth = sum(_value(m, "specdec_accepted_tokens_per_depth_total", {"depth": str(d)}) for d in range(1, 65))
    assert per_depth == accepted
    assert _value(m, "specdec_draft_tokens_total") == sum(len(r.nodes) - 1 for r in decode if r.nodes)
    assert _value(m, "specdec_accepted_length_count") == len(decode)
    assert _value(m, "specdec_rounds_reaching_depth_total", {"depth": "1"}) == sum(1 for r in decode if r.nodes)


def test_registries_are_independent():
    a, b = Metrics(), Metrics()
    a.requests.labels(outcome="ok").inc()
    assert _value(a, "specdec_requests_total", {"outcome": "ok"}) == 1
    assert _value(b, "specdec_requests_total", {"outcome": "ok"}) == 0
