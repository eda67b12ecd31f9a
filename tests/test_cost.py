"""specdec.cost: the measured round-cost model the dynamic tree sizes itself by."""
from __future__ import annotations

import pytest

import specdec
from specdec import cost as cost_mod
from specdec.cost import CostModel
from specdec.events import RoundEvent


def model() -> CostModel:
    return CostModel((1, 2, 4), (1e-3, 2e-3, 2e-3), heads_s=5e-4, overhead_s=1e-4, key="k")


def test_forward_interpolates_and_extrapolates():
    m = CostModel((1, 3, 5), (1.0, 2.0, 4.0), 0.0, 0.0)
    assert m.forward(1) == 1.0 and m.forward(0) == 1.0
    assert m.forward(2) == pytest.approx(1.5)
    assert m.forward(4) == pytest.approx(3.0)
    assert m.forward(7) == pytest.approx(6.0)  # the last slope continues


def test_round_time_adds_the_heads_only_when_they_ran():
    m = model()
    assert m.round_time(2, heads=False) == pytest.approx(2.1e-3)
    assert m.round_time(2, heads=True) == pytest.approx(2.6e-3)


def test_needs_counts_from_one():
    with pytest.raises(ValueError, match="node counts starting at 1"):
        CostModel((2, 4), (1.0, 2.0), 0.0, 0.0)
    with pytest.raises(ValueError):
        CostModel((1, 2), (1.0,), 0.0, 0.0)


def test_json_round_trip():
    m = model()
    assert CostModel.from_json(m.to_json()) == m


def event(index: int, nodes: int, forward_ms: float, draft_ms: float, total_ms: float, heads: bool) -> RoundEvent:
    return RoundEvent(index, (None,) * nodes, (0,), (), {}, "greedy", True,
                      {"draft": draft_ms, "forward": forward_ms, "total": total_ms}, 1,
                      extra={"heads_ran": 1.0} if heads else {})


def test_refresh_moves_toward_the_engines_own_timings():
    m = model()
    events = [event(0, 0, 50.0, 0.0, 60.0, False)]  # the prefill is not a round of the model
    events += [event(i, 4, 4.0, 1.0, 5.2, True) for i in range(1, 6)]
    r = m.refreshed(events, weight=0.5)
    assert r.forward_s[2] == pytest.approx((2e-3 + 4e-3) / 2)  # 4-node rounds: halfway to 4 ms
    assert r.forward_s[:2] == m.forward_s[:2]  # counts with no rounds keep their measurement
    assert r.heads_s == pytest.approx((5e-4 + 1e-3) / 2)
    assert r.overhead_s == pytest.approx((1e-4 + 2e-4) / 2)
    slow = m.refreshed([event(1, 1, 9.0, 0.0, 9.0, False)], weight=1.0)
    assert list(slow.forward_s) == sorted(slow.forward_s)  # a bigger tree never costs less


@pytest.fixture(scope="module")
def loaded(llama):
    return specdec.load(llama, heads="random", device="cpu")


def test_measure_on_a_real_model(loaded):
    m = cost_mod.measure(loaded.engine, budget_s=1.0)
    assert m.nodes[0] == 1 and m.nodes[-1] == 64
    assert all(t > 0 for t in m.forward_s) and list(m.forward_s) == sorted(m.forward_s)
    assert m.heads_s > 0 and m.overhead_s >= 0
    assert m.key == cost_mod.model_key(loaded.engine)


def test_a_tiny_budget_still_gives_a_full_curve(loaded):
    m = cost_mod.measure(loaded.engine, budget_s=1e-6)
    assert m.nodes[0] == 1 and m.nodes[-1] == 64 and len(m.nodes) >= 3  # extrapolated past what was timed


def test_cached_per_model_device_and_dtype(loaded, tmp_path, monkeypatch):
    first = cost_mod.load_or_measure(loaded.engine, tmp_path)
    assert (tmp_path / f"cost-{first.key}.json").is_file()
    monkeypatch.setattr(cost_mod, "measure", lambda *a, **k: pytest.fail("measured again despite the cache"))
    assert cost_mod.load_or_measure(loaded.engine, tmp_path) == first


def test_a_damaged_cache_file_is_measured_again(loaded, tmp_path):
    key = cost_mod.model_key(loaded.engine)
    (tmp_path / f"cost-{key}.json").write_text("{not json")
    assert cost_mod.load_or_measure(loaded.engine, tmp_path).key == key


def test_engine_measures_once_and_refreshes(llama, tmp_path):
    engine = specdec.load(llama, heads="random", device="cpu").engine
    engine._cost_cache = str(tmp_path)
    m = engine.cost_model()
    assert engine.cost_model() is m
    events = list(engine.stream([1, 2, 3], 12, tree="auto", eos_token_id=None))
    refreshed = engine.refresh_cost(events)
    assert engine.cost_model() is refreshed and refreshed != m
    assert cost_mod.CostModel.from_json((tmp_path / f"cost-{m.key}.json").read_text()) == refreshed
