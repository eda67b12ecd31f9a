"""specdec.cost: the measured round-cost model the dynamic tree sizes itself by."""
from __future__ import annotations

from dataclasses import replace

import pytest

import specdec
from specdec import cost as cost_mod
from specdec.cost import CostModel


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


def test_the_overheads_leave_out_the_rows_that_forward_already_times(llama, monkeypatch):
    """forward(N) is timed with its rows: a round's overhead must not count them a second time."""
    engine = specdec.load(llama, heads="random", device="cpu").engine
    timings = {"draft": 0.1, "forward": 1.0, "rows": 0.5, "verify": 0.2, "cache": 0.1, "event": 0.1, "total": 2.0}
    real = engine.stream

    def fixed_timings(*a, **kw):  # the engine's rounds, each with the same stage timings
        return [replace(ev, timings=dict(timings)) for ev in real(*a, **kw)]

    monkeypatch.setattr(engine, "stream", fixed_timings)
    assert cost_mod._overhead(engine, [1, 2, 3, 4]) == pytest.approx(0.5e-3)  # 2.0 - 1.0 - 0.5 ms
    assert cost_mod._drafted_overhead(engine, [1, 2, 3] * 6, 0.3e-3) == pytest.approx(0.2e-3)
    # On CUDA the laps time only the launches: the measured curve's forward(N) stands in for them
    curve = lambda n: 1.2e-3 if n == 1 else 1.4e-3  # noqa: E731
    assert cost_mod._overhead(engine, [1, 2, 3, 4], curve) == pytest.approx(0.8e-3)  # 2.0 - 1.2 ms
    assert cost_mod._drafted_overhead(engine, [1, 2, 3] * 6, 0.3e-3, curve) == pytest.approx(0.3e-3)  # 2.0-1.4-0.3


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


def test_a_second_load_in_this_process_reuses_the_measurement(llama, monkeypatch):
    """Re-running `specdec.load` on the same model measures once; a model of another shape measures its own."""
    from conftest import make_model

    first = specdec.load(llama, heads="random", device="cpu").engine.cost_model()
    monkeypatch.setattr(cost_mod, "measure", lambda *a, **k: pytest.fail("measured again in this process"))
    assert specdec.load(llama, heads="random", device="cpu").engine.cost_model() == first
    other = specdec.load(make_model("llama", context=96), heads="random", device="cpu").engine
    with pytest.raises(pytest.fail.Exception, match="measured again"):  # control: another key is measured
        other.cost_model()


def test_the_key_tells_packed_rows_and_the_attention_implementation_apart(llama):
    from conftest import make_model

    plain = specdec.load(llama, heads="random", device="cpu", packed_rows=False).engine
    packed = specdec.load(llama, heads="random", device="cpu", packed_rows=True).engine
    if packed.target.packed_rows is None:
        pytest.skip("no prepacked oneDNN product in this torch build")
    assert cost_mod.model_key(plain) != cost_mod.model_key(packed)
    eager = specdec.load(make_model("llama", attn="eager"), heads="random", device="cpu", packed_rows=False).engine
    sdpa = specdec.load(make_model("llama", attn="sdpa"), heads="random", device="cpu", packed_rows=False).engine
    assert cost_mod.model_key(eager) != cost_mod.model_key(sdpa)


def test_a_damaged_cache_file_is_measured_again(loaded, tmp_path):
    key = cost_mod.model_key(loaded.engine)
    (tmp_path / f"cost-{key}.json").write_text("{not json")
    assert cost_mod.load_or_measure(loaded.engine, tmp_path).key == key


def test_forward_curve_is_the_nearest_nondecreasing_fit():
    """Pool adjacent violators: a falling run is averaged, not lifted to its first value (a running maximum
    would carry one noisy high median up to every larger count)."""
    from specdec.cost import _nondecreasing

    assert _nondecreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert _nondecreasing([1.0, 9.0, 2.0, 2.0, 2.0, 3.0]) == [1.0, 3.6, 3.6, 3.6, 3.6, 3.6]
    assert _nondecreasing([2.0, 1.0]) == [1.5, 1.5] and _nondecreasing([]) == []
    ys = [1.0, 1.4, 1.2, 1.9, 1.7, 1.8, 2.5]
    fit = _nondecreasing(ys)
    assert all(a <= b for a, b in zip(fit, fit[1:])) and sum(fit) == pytest.approx(sum(ys))  # means kept


def _threads_timed(one: float, many: float):
    """A `_timed` that runs nothing and reports `one` s on one thread, `many` s on more."""
    import torch

    return lambda fn: one if torch.get_num_threads() == 1 else many


@pytest.mark.parametrize("one,many,chosen", [(0.011, 0.010, 1), (0.0124, 0.010, 1), (0.013, 0.010, 2), (0.019, 0.010, 2)])
def test_serving_threads_keeps_one_thread_only_within_its_margin(loaded, monkeypatch, one, many, chosen):
    """One thread is chosen where its forwards take at most 1.25x the default count's (here 2), and the
    caller's count is the same afterwards (the caller sets the choice)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(cost_mod, "_timed", _threads_timed(one, many))
        count, timed = cost_mod.serving_threads(loaded.engine.target, reps=2)
        assert count == chosen
        assert torch.get_num_threads() == 2
        assert timed["default"] == 2 and timed["ms"][1][64] == pytest.approx(one * 1e3)
    finally:
        torch.set_num_threads(before)


def test_serving_threads_on_a_real_forward(loaded):
    """Measured for real: one of the two counts, each size timed on both, in well under a second."""
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        t0 = time.perf_counter()
        count, timed = cost_mod.serving_threads(loaded.engine.target, reps=3)
        assert time.perf_counter() - t0 < 5.0
        assert count in (1, 2) and set(timed["ms"]) == {1, 2} and set(timed["ms"][1]) == {16, 64}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_serving_threads_measures_nothing_with_one_thread(loaded, monkeypatch):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        monkeypatch.setattr(cost_mod, "_timed", lambda fn: pytest.fail("measured with a single thread"))
        assert cost_mod.serving_threads(loaded.engine.target) == (1, {})
    finally:
        torch.set_num_threads(before)
