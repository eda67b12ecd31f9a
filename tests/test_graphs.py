"""specdec.graphs: captured forwards over pooled KV buffers, exact against eager and HF `generate`.

On the CPU the graphs run under `RecordedReplay`, which re-runs the captured function with the
Python state it saw at capture, so anything a real CUDA graph would bake in (the cache length, a
slice bound) shows up here as a wrong answer. The CUDA-only test runs where a GPU is present.
"""
from __future__ import annotations

import logging

import pytest
import torch

import specdec
from conftest import ARCHS, PROMPTS, hf_greedy, make_model
from specdec import GenerationRequest, captured, graphs as graphs_mod, kv_cache
from specdec.draft_tree import PRESETS, build_tree
from specdec.prefix_cache import PrefixCache
from specdec.sampler import SamplingParams


def graphed(model, heads="random", **kw):
    loaded = specdec.load(model, heads=heads, device="cpu", **kw)
    assert loaded.engine.target.use_graphs("recorded")
    return loaded


def tokens(events) -> list[int]:
    return [t.token_id for e in events for t in e.emitted]


def test_token_bucket():
    assert [graphs_mod.token_bucket(n) for n in (1, 2, 3, 5, 16, 17, 128)] == [1, 2, 4, 8, 16, 32, 128]
    assert graphs_mod.token_bucket(129) is None


@pytest.mark.parametrize("arch", ARCHS)
def test_graphed_forward_equals_eager(arch, models):
    """A tree round at a committed length > 0, each bucket captured on its first use, equals an eager forward."""
    model = models[arch]
    target = graphed(model, heads=None).engine.target
    prompt = torch.tensor(PROMPTS[2])
    for n in (1, 2, 5, 9, 17, 26, 40):
        tree = build_tree(PRESETS["default"][: n - 1]) if n > 1 else None
        toks = torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n))
        pooled = target.new_cache(100)
        assert target.graphs.owns(pooled)
        target.forward(prompt, pooled)
        got = target.forward(toks, pooled, *((tree.ancestor_mask, tree.depth_t) if tree else ()))
        committed = [(l.keys[..., : len(prompt), :].clone()) for l in pooled.layers]
        target.release(pooled)
        graphs, target.graphs = target.graphs, None  # the eager reference
        eager = kv_cache.new_cache(model, 256)
        target.forward(prompt, eager)
        want = target.forward(toks, eager, *((tree.ancestor_mask, tree.depth_t) if tree else ()))
        target.graphs = graphs
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for mine, ref in zip(committed, eager.layers):  # capture's warm-up runs left the prompt's slots intact
            torch.testing.assert_close(mine, ref.keys[..., : len(prompt), :], atol=1e-5, rtol=1e-5)
    assert not target.graphs.failures
    assert {k[-1] for k in target.graphs._forwards} == set(graphs_mod.TOKEN_BUCKETS)  # captured at allocation


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree,lookup", [("chain", 0), ("default", 0), ("auto", 0), ("auto", 10), ("none", 10)])
def test_greedy_equals_hf_generate(arch, models, tree, lookup):
    model = models[arch]
    loaded = graphed(model)
    for prompt in PROMPTS[:2]:
        ref = hf_greedy(model, prompt, 40)
        assert tokens(loaded.engine.stream(GenerationRequest(prompt, 40, tree=tree, lookup=lookup))) == ref
    assert not loaded.engine.target.graphs.failures


def test_plain_and_heads_through_graphs(llama):
    loaded = graphed(llama)
    engine, graphs = loaded.engine, loaded.engine.target.graphs
    assert tokens(engine.stream(GenerationRequest(PROMPTS[1], 30, speculative=False))) == hf_greedy(llama, PROMPTS[1], 30)
    h = torch.randn(llama.config.hidden_size)
    for k in (1, 2, 4):  # a probe (the first head alone) and every head
        torch.testing.assert_close(engine.head_logits(h, k), loaded.heads(h)[:k], atol=1e-5, rtol=1e-5)
    assert {k for _, k in graphs._heads} == {1, 2, 4}


def test_after_any_commits_the_buffer_equals_a_fresh_prefill(llama):
    """Graphed rounds with random accepted paths: the pooled buffer's committed slots are a prefill's."""
    target = graphed(llama, heads=None).engine.target
    gen = torch.Generator().manual_seed(0)
    committed = list(PROMPTS[1])
    cache = target.new_cache(200)
    assert target.graphs.owns(cache)
    target.forward(torch.tensor(committed), cache)
    tree = build_tree(PRESETS["default"])
    for _ in range(12):
        toks = torch.randint(0, 128, (tree.num_nodes,), generator=gen)
        target.forward(toks, cache, tree.ancestor_mask, tree.depth_t)
        leaf = int(torch.randint(0, tree.num_nodes, (1,), generator=gen))
        path = [leaf]
        while tree.parent[path[-1]] >= 0:
            path.append(tree.parent[path[-1]])
        path = path[::-1]
        kv_cache.keep_path(cache, len(committed), path)
        committed += [int(toks[i]) for i in path]
    fresh = kv_cache.new_cache(llama, 256)
    graphs, target.graphs = target.graphs, None
    target.forward(torch.tensor(committed), fresh)
    target.graphs = graphs
    assert cache.length == len(committed)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys[..., : len(committed), :], ref.keys[..., : len(committed), :],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values[..., : len(committed), :], ref.values[..., : len(committed), :],
                                   atol=1e-5, rtol=1e-5)


def test_a_round_past_the_buffer_runs_eagerly(llama, monkeypatch):
    """At the capacity boundary, a round whose bucket would not fit runs eagerly in the same buffer, exactly."""
    target = graphed(llama, heads=None).engine.target
    cache = target.new_cache(200)  # 256 slots, every bucket captured
    replays = []
    call = captured.Forward.__call__
    monkeypatch.setattr(captured.Forward, "__call__", lambda self, rows: replays.append(self.tokens) or call(self, rows))
    prompt = torch.randint(0, 128, (250,), generator=torch.Generator().manual_seed(1))
    target.forward(prompt, cache)  # 250 tokens: beyond every bucket, eager
    toks = torch.tensor([3, 4, 5, 6, 7])  # bucket 8 would need slots up to 258
    got = target.forward(toks, cache)
    assert cache.length == 255 and replays == []
    graphs, target.graphs = target.graphs, None
    want = target.forward(torch.cat([prompt, toks]), kv_cache.new_cache(llama, 256))[-5:]
    target.graphs = graphs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_pool_lends_its_buffers_one_request_each(llama):
    """POOL_SIZE requests side by side (the app's race) each get a pooled buffer; one more runs eagerly, as exactly."""
    loaded = graphed(llama)
    engine, graphs = loaded.engine, loaded.engine.target.graphs
    ref = hf_greedy(llama, PROMPTS[0], 24)
    held = [engine.stream(GenerationRequest(PROMPTS[0], 24, tree="default")) for _ in range(graphs_mod.POOL_SIZE)]
    for s in held:
        next(s)  # each holds a pooled buffer
    assert sum(r() is not None for r in graphs._lent.values()) == graphs_mod.POOL_SIZE
    extra = engine.target.new_cache(40)
    assert not graphs.owns(extra)  # all lent: its own buffer, eager
    assert tokens(engine.stream(GenerationRequest(PROMPTS[0], 24, tree="default"))) == ref
    outs = [[t.token_id for t in ev.emitted] for s in held for ev in s]  # the rest of each stream
    assert len(outs) > 0
    assert all(r() is None for r in graphs._lent.values())  # released at the end of each stream
    stopped = engine.stream(GenerationRequest(PROMPTS[0], 24, tree="default"))
    next(stopped)
    stopped.close()  # a consumer that lets go early gives its buffer back too
    got = [engine.target.new_cache(40) for _ in range(graphs_mod.POOL_SIZE)]
    assert all(graphs.owns(c) for c in got)


def test_side_by_side_streams_are_exact(llama):
    """Two pooled streams interleaved round by round (as the race runs them) each equal HF generate."""
    loaded = graphed(llama)
    a = loaded.engine.stream(GenerationRequest(PROMPTS[0], 30, tree="default"))
    b = loaded.engine.stream(GenerationRequest(PROMPTS[1], 30, speculative=False))
    out = {0: [], 1: []}
    live = {0: a, 1: b}
    while live:
        for k in list(live):
            ev = next(live[k], None)
            if ev is None:
                del live[k]
            else:
                out[k] += [t.token_id for t in ev.emitted]
    assert out[0] == hf_greedy(llama, PROMPTS[0], 30) and out[1] == hf_greedy(llama, PROMPTS[1], 30)
    assert len(loaded.engine.target.graphs._cores) == 2


def test_prefix_cache_hit_through_graphs(llama):
    loaded = graphed(llama, prefix_cache=PrefixCache(min_tokens=4))
    prompt = PROMPTS[1]
    ref = hf_greedy(llama, prompt + [11], 30)
    list(loaded.engine.stream(GenerationRequest(prompt, 5, tree="default")))
    events = list(loaded.engine.stream(GenerationRequest(prompt + [11], 30, tree="default")))
    assert events[0].prefix_cache_hit >= len(prompt) - 1
    assert tokens(events) == ref


def test_sliding_window_past_the_window_stays_exact():
    """Rounds that reach a sliding window run eagerly (their mask is built there); the rest replay."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        sliding_window=12, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    loaded = graphed(model)
    ref = hf_greedy(model, PROMPTS[0], 40)
    assert tokens(loaded.engine.stream(GenerationRequest(PROMPTS[0], 40, tree="default"))) == ref


def test_capture_failure_falls_back_to_eager(llama, monkeypatch, caplog):
    loaded = graphed(llama)

    def broken(self, fn, state=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs_mod.Graphs, "capture", broken)
    with caplog.at_level(logging.WARNING, logger="specdec.graphs"):
        out = tokens(loaded.engine.stream(GenerationRequest(PROMPTS[0], 24, tree="default")))
    assert out == hf_greedy(llama, PROMPTS[0], 24)
    graphs = loaded.engine.target.graphs
    assert graphs.failures and all(v is None for v in graphs._forwards.values())
    assert "running it eagerly" in caplog.text


def test_negative_control_a_write_at_the_python_length_is_caught(llama, monkeypatch):
    """Planted bug: layers write at the cache's Python length, not the device index. A real graph bakes
    that length in at capture; the recorded replay does too, and the output leaves HF's."""
    original = kv_cache._SlotLayer.update

    def baked(self, key_states, value_states, *args, **kwargs):
        if self.owner.write_index is not None and self.is_initialized:
            start = self.owner.length
            self.keys[:, :, start : start + key_states.shape[-2]] = key_states
            self.values[:, :, start : start + key_states.shape[-2]] = value_states
            return self.keys, self.values
        return original(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(kv_cache._SlotLayer, "update", baked)
    loaded = graphed(llama)
    out = tokens(loaded.engine.stream(GenerationRequest(PROMPTS[1], 40, tree="default")))
    assert out != hf_greedy(llama, PROMPTS[1], 40)


def test_load_cuda_graphs_argument(llama):
    with pytest.raises(ValueError, match="cuda_graphs"):
        specdec.load(llama, heads=None, device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs"):
        specdec.load(llama, heads=None, device="cpu", cuda_graphs="yes")
    assert specdec.load(llama, heads=None, device="cpu").engine.target.graphs is None
    with pytest.raises(ValueError, match="capture"):
        graphs_mod.Graphs(specdec.load(llama, heads=None, device="cpu").engine.target, "replay")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_greedy_equals_hf_generate_fp32():
    for arch in ARCHS:
        model = make_model(arch).cuda()
        loaded = specdec.load(model, heads="random", device="cuda", dtype="float32")
        assert loaded.engine.target.graphs is not None
        for tree in ("chain", "default", "auto"):
            ids = torch.tensor([PROMPTS[1]], device="cuda")
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                                 min_new_tokens=40, pad_token_id=0)[0, ids.shape[1]:].tolist()
            got = tokens(loaded.engine.stream(GenerationRequest(PROMPTS[1], 40, tree=tree, lookup=10,
                                                                params=SamplingParams())))
            assert got == ref, (arch, tree)
        assert not loaded.engine.target.graphs.failures


def test_info_names_what_was_captured_and_what_fell_back(llama):
    loaded = graphed(llama)
    list(loaded.engine.stream(GenerationRequest(PROMPTS[0], 12, tree="default")))
    info = loaded.engine.info()["cuda_graphs"]
    assert info["mode"] == "recorded" and info["failures"] == {}
    assert "64 tokens / 256 slots" in info["forwards"] and info["heads"] == [4]
    assert specdec.load(llama, heads=None, device="cpu").engine.info()["cuda_graphs"] is None


def test_a_failed_request_leaves_a_zeroed_buffer(llama):
    """A request that ends in an error may leave NaN in its slots: the pooled buffer is zeroed for the next one."""
    loaded = graphed(llama)
    engine = loaded.engine

    def boom(ev):
        if ev.index == 2:
            raise RuntimeError("a callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        list(engine.stream(GenerationRequest(PROMPTS[1], 30, tree="default"), on_round=boom))
    core = next(iter(engine.target.graphs._cores.values()))
    assert all(float(l.keys.abs().sum()) == 0 and float(l.values.abs().sum()) == 0 for l in core.layers)
    assert tokens(engine.stream(GenerationRequest(PROMPTS[1], 30, tree="default"))) == hf_greedy(llama, PROMPTS[1], 30)
    assert float(core.layers[0].keys.abs().sum()) > 0  # a request that ends well leaves its slots alone


# -- batched rounds (the scheduler's `forward_rows`) through graphs ------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_batched_rounds_through_graphs_equal_hf_generate(arch, models):
    """Requests joining and leaving a batch of up to 4 (rows bucketed to 1, 2, 4), trees and lookup mixed."""
    model = models[arch]
    loaded = graphed(model, max_batch_size=4)
    prompts = [PROMPTS[i % 3] + [i] for i in range(6)]
    lengths = [40, 12, 33, 25, 8, 40]
    out = [None] * 6
    with loaded.scheduler as s:
        tickets = [s.submit(GenerationRequest(p, n, tree=("auto", "default", "chain")[i % 3], lookup=10 * (i % 2),
                                              eos_token_id=None)) for i, (p, n) in enumerate(zip(prompts, lengths))]
        for i, t in enumerate(tickets):
            out[i] = tokens(t)
        assert max(s.stats()["batch_sizes"]) == 4
    for p, n, got in zip(prompts, lengths, out):
        assert got == hf_greedy(model, p, n)
    info = loaded.engine.info()["cuda_graphs"]
    assert info["batched"] and not info["failures"]
    assert any(x.startswith("4 rows") for x in info["batched"]) and any(x.startswith("2 rows") for x in info["batched"])


def test_round_0_shared_by_joining_requests_replays_a_graph_and_stays_exact(llama):
    """A wave that joins an empty batch (its buffer already allocated by an earlier wave) runs round 0 as
    one forward from row 0: it replays a captured graph of chains, and every output equals HF's."""
    from conftest import submit_together

    loaded = graphed(llama, max_batch_size=4)
    graphs = loaded.engine.target.graphs
    replayed, real = [], graphs.forward_rows

    def forward_rows(cache, lo, toks, trees):
        out = real(cache, lo, toks, trees)
        if len(toks) > 1 and all(t is None for t in trees) and max(map(len, toks)) > 1:
            replayed.append((lo, [len(t) for t in toks], out is not None))
        return out

    graphs.forward_rows = forward_rows
    first = [GenerationRequest(p, 6, eos_token_id=None) for p in PROMPTS[:2]]
    second = [GenerationRequest(p + [7, 7], 10, tree="default", eos_token_id=None) for p in PROMPTS]
    with loaded.scheduler as s:
        got = [tokens(t) for t in submit_together(s, first)]  # allocates the batch's buffer, then leaves
        got += [tokens(t) for t in submit_together(s, second)]
    assert got == [hf_greedy(llama, list(r.prompt_ids), r.max_new_tokens) for r in first + second]
    assert replayed[-1] == (0, sorted(len(p) + 2 for p in PROMPTS), True), replayed


def test_a_nan_prompt_in_a_shared_round_0_gives_its_pooled_buffer_back_zeroed(llama):
    """A prompt whose prefill chunks hold NaN joins with a clean one: it fails as non-finite, and the pooled
    buffer it prefilled in goes back zeroed, so the next request to borrow it decodes exactly (it went
    back as it was once, before the verdict, and the next request failed too)."""
    from conftest import submit_together
    from specdec import RequestFailed

    loaded = graphed(llama, heads=None)
    poisoned = 127  # a token id whose embedding becomes NaN

    def poison(module, args, output):
        hit = args[0] == poisoned
        return output.masked_fill(hit[..., None], float("nan")) if hit.any() else None

    handle = llama.get_input_embeddings().register_forward_hook(poison)
    try:
        bad = [5, 6, poisoned] + list(range(10, 27))  # 20 tokens: two chunks of 8 first, then round 0
        with specdec.scheduler.Scheduler(loaded.engine, max_batch_size=4, prefill_chunk=8) as s:
            ta, tb = submit_together(s, [GenerationRequest(bad, 8, eos_token_id=None, speculative=False),
                                         GenerationRequest([1, 2, 3], 8, eos_token_id=None, speculative=False)])
            with pytest.raises(RequestFailed, match="non_finite"):
                ta.result(timeout=60)
            assert tokens(tb.result(timeout=60)) == hf_greedy(llama, [1, 2, 3], 8)
            tc = s.submit(GenerationRequest([9, 8, 7], 8, eos_token_id=None, speculative=False))
            assert tokens(tc.result(timeout=60)) == hf_greedy(llama, [9, 8, 7], 8)
    finally:
        handle.remove()


def _graphed_load(monkeypatch):
    """Make every specdec.load in the test run its forwards through (recorded) graphs."""
    real = specdec.load

    def load(*a, **k):
        loaded = real(*a, **k)
        assert loaded.engine.target.use_graphs("recorded")
        return loaded

    monkeypatch.setattr(specdec, "load", load)


@pytest.mark.slow
def test_batched_graphs_each_request_follows_its_own_law(monkeypatch):
    """test_scheduler's mixed batch (three sampler settings side by side), every round through graphs."""
    import test_scheduler as ts

    _graphed_load(monkeypatch)
    model = make_model("llama", vocab=ts.V, seed=3, init=0.2)
    counts = ts.mixed_counts(model, ts.N_MIXED, seed0=60_000)
    for k, p in ts.KINDS.items():
        law = ts.joint_after_first(model, p)
        assert counts[k][law == 0].sum() == 0, k
        assert ts.chi2_pvalue(counts[k], law) > ts.PASS_P, k


@pytest.mark.slow
def test_batched_graphs_negative_control_queries_see_every_new_slot(monkeypatch):
    """Planted bug in the staged inputs: every query sees every new slot (siblings, padding). It must fail."""
    import test_scheduler as ts

    _graphed_load(monkeypatch)
    fill = captured.Forward.fill

    def leaky(self, rows):
        fill(self, rows)
        if self.rows >= 4:  # not in the load-time probe of two rows, which would catch it and turn batching off
            self.stage[:, 3:, :] = 1

    monkeypatch.setattr(captured.Forward, "fill", leaky)
    model = make_model("llama", vocab=ts.V, seed=3, init=0.2)
    counts = ts.mixed_counts(model, ts.N_MIXED // 2, seed0=60_000)
    # Every kind's law is wrong under the bug; the most skewed one must be caught outright.
    assert min(ts.chi2_pvalue(counts[k], ts.joint_after_first(model, p)) for k, p in ts.KINDS.items()) < ts.FAIL_P


@pytest.mark.parametrize("size", [1, 4])
def test_the_scheduler_gives_pooled_buffers_back(llama, size):
    """Through the scheduler (one at a time, or adopted into batch rows), every pooled buffer goes back
    when its request is done, with the cycle collector off: no buffer waits for a collection."""
    import gc

    loaded = graphed(llama, max_batch_size=size)
    graphs = loaded.engine.target.graphs
    gc.disable()
    try:
        with loaded.scheduler as s:
            tickets = [s.submit(GenerationRequest(p, 12, tree="default", eos_token_id=None)) for p in PROMPTS]
            assert [tokens(t) for t in tickets] == [hf_greedy(llama, p, 12) for p in PROMPTS]
            lent = [key for key, ref in graphs._lent.items() if ref() is not None]
        assert lent == []
    finally:
        gc.enable()


@pytest.mark.parametrize("size", [1, 4])
def test_a_request_failing_in_the_scheduler_leaves_a_zeroed_buffer(llama, size):
    """A fault in round 0, before the request joins the batch's rows: the pooled buffer it held comes back
    zeroed, and the next request is exact. (Later faults are in a batch row, which `Batch.remove` clears.)"""
    from specdec import RequestFailed, Scheduler

    loaded = graphed(llama, max_batch_size=size)
    graphs = loaded.engine.target.graphs

    def hook(rid, index, step):
        if rid == 0 and step == "forward" and index == 0:
            raise RuntimeError("planted fault")

    with Scheduler(loaded.engine, max_batch_size=size, fault_hook=hook) as s:
        with pytest.raises(RequestFailed):
            tokens(s.submit(GenerationRequest(PROMPTS[1], 12, tree="default", eos_token_id=None)))
        core = next(iter(graphs._cores.values()))
        assert all(float(layer.keys.abs().sum()) == 0 for layer in core.layers)
        ok = tokens(s.submit(GenerationRequest(PROMPTS[1], 12, tree="default", eos_token_id=None)))
    assert ok == hf_greedy(llama, PROMPTS[1], 12)
