"""Prefix KV cache: identical output with and without it, and a byte budget that holds."""
from __future__ import annotations

import threading

import pytest
import torch

import specdec
from specdec import kv_cache
from specdec.prefix_cache import PrefixCache

from conftest import make_model


@pytest.fixture(scope="module")
def model():
    return make_model("llama", seed=3)


def _run(loaded, ids, **kw):
    return specdec.generate(loaded, prompt_ids=ids, max_new_tokens=24, **kw)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_p=0.9, seed=7)])
def test_output_identical_with_and_without_cache(model, sampling):
    plain = specdec.load(model, heads="random")
    cached = specdec.load(model, heads="random", prefix_cache=PrefixCache(max_bytes=10**8, min_tokens=4))
    # The dynamic tree sizes itself by a measured cost model; two loads measure two (timing noise), so
    # their sampled runs would draw different trees. One model for both leaves the cache the only change.
    cached.engine.set_cost_model(plain.engine.cost_model())
    system = list(range(3, 40))  # a shared "system prompt"
    prompts = [system + [50, 51, 52], system + [60, 61], system + [50, 51, 52]]  # new suffix, then a regenerate
    hits = []
    for ids in prompts:
        for speculative in (True, False):
            a = _run(plain, ids, speculative=speculative, **sampling)
            b = _run(cached, ids, speculative=speculative, **sampling)
            assert a.token_ids == b.token_ids
            hits.append(b.rounds[0].prefix_cache_hit)
    assert hits[0] == 0  # cold
    assert max(hits) >= len(system)  # the shared prefix was reused
    assert cached.engine.prefix_cache.hit_ratio > 0


def test_restored_cache_equals_fresh_prefill(model):
    target = specdec.target.TargetModel(model)
    ids = list(range(5, 35))
    pc = PrefixCache(max_bytes=10**8, min_tokens=1)
    c = kv_cache.new_cache(model)
    target.forward(torch.tensor(ids), c)
    pc.insert(ids, c)
    restored, n = pc.lookup(model, ids + [7, 8])
    assert n == len(ids)
    for (k, v), layer in zip(kv_cache.snapshot(restored, n), c.layers):
        assert torch.equal(k, layer.keys[..., :n, :]) and torch.equal(v, layer.values[..., :n, :])
    # handing out a copy: writing into the restored cache leaves the entry intact
    with torch.inference_mode():
        restored.layers[0].keys.zero_()
    again, _ = pc.lookup(model, ids + [9])
    assert torch.equal(again.layers[0].keys[..., :n, :], c.layers[0].keys[..., :n, :])


def test_eviction_keeps_the_budget(model):
    target = specdec.target.TargetModel(model)
    one = None
    pc = None
    for i in range(8):
        ids = [i + 1] * 20 + list(range(10, 30))
        c = kv_cache.new_cache(model)
        target.forward(torch.tensor(ids), c)
        if pc is None:
            one = kv_cache.nbytes(kv_cache.snapshot(c, len(ids)))
            pc = PrefixCache(max_bytes=3 * one, min_tokens=1)
        pc.insert(ids, c)
        assert pc.bytes <= pc.max_bytes
    assert len(pc) == 3 and pc.bytes == 3 * one
    # the oldest entries went first (LRU): the first prompt no longer hits fully
    _, n = pc.lookup(model, [1] * 20 + list(range(10, 30)))
    assert n < 20


def test_min_tokens_and_negative_budget(model):
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)
    pc = PrefixCache(max_bytes=10**8, min_tokens=16)
    assert pc.lookup(model, [1, 2, 3]) == (None, 0)
    assert pc.hit_ratio == 0.0


def test_thread_safe_under_concurrent_use(model):
    loaded = specdec.load(model, heads="random", prefix_cache=PrefixCache(max_bytes=10**7, min_tokens=4))
    base = list(range(3, 30))
    ref = {i: _run(specdec.load(model, heads="random"), base + [40 + i]).token_ids for i in range(4)}
    errors, out = [], {}

    def work(i):
        try:
            out[i] = _run(loaded, base + [40 + i]).token_ids
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert out == ref


def test_concurrent_inserts_of_the_same_prompt_count_bytes_once(model, monkeypatch):
    """Two threads insert the same prompt; both pass the first membership check before either
    stores (a barrier inside the snapshot forces that interleaving). The byte total must still
    equal the sum over entries, never counting the prompt twice."""
    pc = PrefixCache(max_bytes=10**9, min_tokens=1)
    cache = kv_cache.new_cache(model)
    ids = list(range(10))
    specdec.target.TargetModel(model).forward(torch.tensor(ids), cache)
    barrier = threading.Barrier(2, timeout=10)
    real = kv_cache.snapshot

    def slow_snapshot(c, upto):
        barrier.wait()
        return real(c, upto)

    monkeypatch.setattr(kv_cache, "snapshot", slow_snapshot)
    threads = [threading.Thread(target=pc.insert, args=(ids, cache)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(pc) == 1
    assert pc.bytes == sum(e.nbytes for e in pc._entries.values())


@pytest.mark.parametrize("together", [1, 2])
def test_a_prompt_whose_prefill_is_nan_is_not_kept(together):
    """A prompt whose rows come out NaN fails its request; it must not be kept, or every request starting
    with it would fail too. Alone (its own buffer) and with another joining request (a shared round 0)."""
    from conftest import submit_together
    from specdec.request import GenerationRequest
    from specdec import RequestFailed, Scheduler

    model = make_model("llama")
    cache = PrefixCache(min_tokens=4)
    loaded = specdec.load(model, heads=None, device="cpu", prefix_cache=cache)
    poisoned = 127

    def poison(module, args, output):
        hit = args[0] == poisoned
        return output.masked_fill(hit[..., None], float("nan")) if hit.any() else None

    handle = model.get_input_embeddings().register_forward_hook(poison)
    try:
        with Scheduler(loaded.engine, max_batch_size=2) as s:
            bad = GenerationRequest([5, 6, poisoned, 9, 10, 11], 4, eos_token_id=None, speculative=False)
            good = GenerationRequest([1, 2, 3, 4, 5, 6, 7], 4, eos_token_id=None, speculative=False)
            tickets = submit_together(s, [bad, good][:together])
            with pytest.raises(RequestFailed, match="non_finite"):
                tickets[0].result(timeout=60)
            [t.result(timeout=60) for t in tickets[1:]]
    finally:
        handle.remove()
    assert len(cache) == together - 1  # only the clean prompt is kept
