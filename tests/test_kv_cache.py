"""specdec.kv_cache: rollback keeps exactly the accepted path (a gather, not a crop)."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPTS, VOCAB, make_model, naive_logits, oracle_loaded
from specdec import kv_cache
from specdec.draft_tree import build_tree
from specdec.target import TargetModel


def synthetic_cache(model, prefix: int, nodes: int):
    """A cache whose entry at position t holds the value t in every layer (keys) and -t (values)."""
    cache = kv_cache.new_cache(model)
    T = prefix + nodes
    pos = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(1, 2, T, 8).clone()  # [B, H, T, Dh]
    for layer in range(model.config.num_hidden_layers):
        cache.update(pos + 1000 * layer, -pos - 1000 * layer, layer)
    return cache


def synthetic_slots(layers: int, prefix: int, nodes: int, rows: int = 0) -> kv_cache.SlotCache | kv_cache.BatchCache:
    """A SlotCache (rows=0) or BatchCache whose slot t holds t + 1000 * layer (+ 100 * row) as keys and minus that as values."""
    T = prefix + nodes
    cache = kv_cache.BatchCache(layers, rows, 32) if rows else kv_cache.SlotCache(layers, 32)
    pos = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(max(rows, 1), 2, T, 8).clone()  # [B, H, T, Dh]
    pos += 100 * torch.arange(max(rows, 1)).view(-1, 1, 1, 1)
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(pos, pos)
        layer.keys[:, :, :T] = pos + 1000 * i
        layer.values[:, :, :T] = -pos - 1000 * i
    if rows:
        cache.lengths = [T] * rows
    else:
        cache.length = T
    return cache


@pytest.mark.parametrize("rows", [0, 3])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("nodes", [[0, 2, 5], [0, 1, 2], [0, 1, 4, 6]])
def test_keep_path_in_a_slot_buffer_one_block_or_layer_by_layer(nodes, fused, rows):
    """Every layer's keys and values are views of one block, moved by one gather; without it, layer by layer."""
    P, N = 5, 7
    cache = synthetic_slots(3, P, N, rows)
    assert cache.block is not None and cache.layers[2].values.data_ptr() == cache.block[2, 1].data_ptr()
    if not fused:
        cache.block = None  # as when one layer's shape differs
    target = kv_cache.RowCache(cache, 1) if rows else cache
    kv_cache.keep_path(target, P, nodes)
    assert kv_cache.length(target) == P + len(nodes)
    want = list(range(P)) + [P + n for n in nodes]
    r = 1 if rows else 0
    for i, layer in enumerate(cache.layers):
        assert layer.keys[r, 1, : len(want), 3].tolist() == [w + 1000 * i + 100 * r for w in want]
        assert layer.values[r, 0, : len(want), 0].tolist() == [-w - 1000 * i - 100 * r for w in want]
        if rows:  # the other rows are untouched
            assert layer.keys[0, 0, : P + N, 0].tolist() == [t + 1000 * i for t in range(P + N)]


def test_a_batch_buffer_adopting_requests_keeps_one_block(llama):
    """Rows filled from requests' own buffers (one row each) still share one block across layers."""
    target = TargetModel(llama)
    batch = kv_cache.BatchCache(llama.config.num_hidden_layers, 3, 64)
    for row, n in enumerate((4, 6)):
        solo = kv_cache.new_cache(llama, capacity=64)
        target.forward(torch.tensor(PROMPTS[1][:n]), solo)
        batch.adopt(row, solo)
    assert batch.block is not None and batch.layers[1].keys.data_ptr() == batch.block[1, 0].data_ptr()


def test_a_grown_batch_buffer_keeps_one_block():
    cache = synthetic_slots(2, 4, 2, rows=2)
    cache.grow(64)
    assert cache.block.shape[4] == 64 and cache.layers[1].keys.data_ptr() == cache.block[1, 0].data_ptr()
    assert cache.layers[1].keys[1, 0, :6, 0].tolist() == [t + 1000 + 100 for t in range(6)]


@pytest.mark.parametrize("nodes", [[0, 2, 5], [0, 1, 2], [0], [0, 3], [0, 1, 4, 6]])
def test_keep_path_gathers_the_accepted_entries(llama, nodes):
    P, N = 5, 7
    cache = synthetic_cache(llama, P, N)
    assert kv_cache.length(cache) == P + N
    kv_cache.keep_path(cache, P, nodes)
    assert kv_cache.length(cache) == P + len(nodes)
    want = list(range(P)) + [P + n for n in nodes]
    for i, layer in enumerate(cache.layers):
        assert layer.keys.shape[-2] == layer.values.shape[-2] == P + len(nodes)
        assert layer.keys[0, 1, :, 3].tolist() == [w + 1000 * i for w in want]
        assert layer.values[0, 0, :, 0].tolist() == [-w - 1000 * i for w in want]


def test_snapshot_restore(llama):
    cache = synthetic_cache(llama, 4, 6)
    saved = kv_cache.snapshot(cache, 8)
    assert kv_cache.nbytes(saved) == 2 * 2 * (1 * 2 * 8 * 8) * 4  # layers x (k, v) x elements x fp32
    fresh = kv_cache.restore(llama, saved, 6)
    assert kv_cache.length(fresh) == 6
    assert fresh.layers[1].keys[0, 0, :, 0].tolist() == [1000.0 + t for t in range(6)]
    with torch.inference_mode():
        fresh.layers[0].keys.add_(1)  # a restored cache never writes through to the snapshot
    assert saved[0][0][0, 0, :, 0].tolist() == [float(t) for t in range(8)]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decoding_continues_correctly_after_a_non_contiguous_rollback(arch):
    """Tree forward, keep a non-contiguous path, then decode: logits equal a fresh forward."""
    model = make_model(arch)
    target = TargetModel(model)
    tree = build_tree(((0,), (1,), (2,), (0, 0), (1, 0), (1, 1), (2, 0), (1, 1, 0)))
    tokens = torch.tensor([9, 10, 11, 12, 13, 14, 15, 16, 17])  # [N]
    accepted = [tree.paths.index(p) for p in [(), (1,), (1, 1), (1, 1, 0)]]
    assert accepted == [0, 2, 6, 8]  # not a prefix of the tree order
    prompt = [4, 8, 15, 16]
    cache = kv_cache.new_cache(model)
    target.forward(torch.tensor(prompt), cache)
    target.forward(tokens, cache, tree.ancestor_mask, tree.depth_t)
    kv_cache.keep_path(cache, len(prompt), accepted)
    committed = prompt + tokens[accepted].tolist()
    assert kv_cache.length(cache) == len(committed)
    # the kept entries equal those of a fresh prefill of the committed sequence
    fresh = kv_cache.new_cache(model)
    target.forward(torch.tensor(committed), fresh)
    for got, want in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=0)
    # and decoding continues as if the tree had never happened
    for nxt in [3, 77]:
        h = target.forward(torch.tensor([nxt]), cache)
        committed.append(nxt)
        torch.testing.assert_close(target.logits(h[-1]), naive_logits(model, committed), atol=1e-5, rtol=0)


class CacheSpy:
    """Captures the cache the engine creates, to inspect it between rounds."""

    def __init__(self, monkeypatch) -> None:
        self.caches = []
        self.real = real = kv_cache.new_cache

        def spy(model, capacity=None):
            cache = real(model, capacity)
            self.caches.append(cache)
            return cache

        monkeypatch.setattr(kv_cache, "new_cache", spy)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_engine_cache_holds_exactly_the_committed_tokens(arch, models, monkeypatch):
    """After every round: cache length = prompt + emitted - 1 (the pending token), and its
    contents equal a fresh prefill of those tokens, even after partial, non-contiguous acceptance."""
    model = models[arch]
    prompt, n = PROMPTS[1], 40
    # the oracle ranks the right token 0, 1, 2 or outside the tree: partial and off-first-branch paths
    loaded, ref = oracle_loaded(model, prompt, n, rank_of=lambda pos, k: (pos * 7 + k * 3) % 5)
    spy = CacheSpy(monkeypatch)
    target = loaded.engine.target
    out, partial_non_contiguous = [], 0
    for ev in loaded.engine.stream(prompt, n, specdec.SamplingParams(), tree="default", eos_token_id=None):
        out += [t.token_id for t in ev.emitted]
        cache = spy.caches[-1]
        committed = prompt + out[:-1]
        assert kv_cache.length(cache) == len(committed), f"round {ev.index}"
        path = list(ev.accepted_path)
        if ev.nodes and path != list(range(len(path))):
            partial_non_contiguous += 1
        if ev.index % 3 == 0 or ev.finished:
            fresh = spy.real(model)
            target.forward(torch.tensor(committed), fresh)
            L = len(committed)
            for got, want in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(got.keys[..., :L, :], want.keys, atol=1e-5, rtol=0)
                torch.testing.assert_close(got.values[..., :L, :], want.values, atol=1e-5, rtol=0)
    assert len(spy.caches) == 1
    assert isinstance(spy.caches[0], kv_cache.SlotCache)  # the position-addressed buffer, not the fallback
    assert spy.caches[0].capacity % 64 == 0 and spy.caches[0].capacity >= len(prompt) + n
    assert partial_non_contiguous >= 2, "the test must exercise non-contiguous rollbacks"
    assert out == ref[:n]
    plain = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=n, speculative=False, eos_token_id=None)
    assert plain.token_ids == out


@pytest.mark.parametrize("fixed_shapes", [True, False])  # the whole buffer (CUDA's choice) or the slots in use
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_slot_buffer_equals_a_fresh_prefill_after_any_commits(arch, models, fixed_shapes):
    """Random trees, random accepted paths (non-contiguous too), until the buffer is exactly full:
    after every commit the committed slots equal a fresh prefill of the committed tokens, the next
    token's logits equal a cache-free forward, and nothing was ever reallocated."""
    model = models[arch]
    target = TargetModel(model)
    assert target.slots
    g = torch.Generator().manual_seed(1)
    committed = [5, 9, 2]
    capacity = 64
    cache = kv_cache.new_cache(model, capacity)
    cache.fixed_shapes = fixed_shapes
    target.forward(torch.tensor(committed), cache)
    buffers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    from specdec.draft_tree import PRESETS

    trees = [build_tree(PRESETS["small"]), build_tree(PRESETS["chain"]), build_tree(())]
    while True:
        tree = trees[int(torch.randint(3, (1,), generator=g))]
        if kv_cache.length(cache) + tree.num_nodes > capacity:
            tree = build_tree(())  # fill the last slots one token at a time
            if kv_cache.length(cache) + 1 > capacity:
                break
        tokens = torch.randint(0, VOCAB, (tree.num_nodes,), generator=g)
        L = kv_cache.length(cache)
        target.forward(tokens, cache, tree.ancestor_mask, tree.depth_t)
        assert kv_cache.length(cache) == L + tree.num_nodes
        path = [0]  # a random root-to-node path
        while tree.children[path[-1]] and torch.rand(1, generator=g) < 0.8:
            kids = tree.children[path[-1]]
            path.append(kids[int(torch.randint(len(kids), (1,), generator=g))])
        kv_cache.keep_path(cache, L, path)
        committed += [int(tokens[i]) for i in path]
        assert kv_cache.length(cache) == len(committed) <= capacity
        fresh = kv_cache.new_cache(model)
        h = target.forward(torch.tensor(committed), fresh)
        for got, want in zip(cache.layers, fresh.layers):
            torch.testing.assert_close(got.keys[..., : len(committed), :], want.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(got.values[..., : len(committed), :], want.values, atol=1e-5, rtol=0)
        torch.testing.assert_close(target.logits(h[-1]), naive_logits(model, committed), atol=1e-5, rtol=0)
    assert len(committed) == capacity  # filled to the last slot
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == buffers
    with pytest.raises(AssertionError, match="overflow"):
        target.forward(torch.tensor([1]), cache)


def test_slot_cache_snapshot_restore_keeps_capacity(llama):
    target = TargetModel(llama)
    cache = kv_cache.new_cache(llama, 64)
    target.forward(torch.tensor([3, 4, 5, 6, 7]), cache)
    saved = kv_cache.snapshot(cache, 5)
    back = kv_cache.restore(llama, saved, 4, capacity=128)
    assert isinstance(back, kv_cache.SlotCache) and back.capacity == 128 and kv_cache.length(back) == 4
    h = target.forward(torch.tensor([7]), back)
    torch.testing.assert_close(target.logits(h[-1]), naive_logits(llama, [3, 4, 5, 6, 7]), atol=1e-5, rtol=0)


def test_engine_with_fixed_shape_buffers_equals_hf(models, monkeypatch):
    """The engine over a whole-buffer mask (what a CUDA graph replays) stays exactly greedy on the CPU."""
    real = kv_cache.new_cache

    def fixed(model, capacity=None):
        cache = real(model, capacity)
        if capacity is not None:
            cache.fixed_shapes = True
        return cache

    monkeypatch.setattr(kv_cache, "new_cache", fixed)
    for arch in ("llama", "gpt2"):
        loaded, ref = oracle_loaded(models[arch], PROMPTS[1], 30, rank_of=lambda pos, k: (pos + k) % 3)
        out = specdec.generate(loaded, prompt_ids=PROMPTS[1], max_new_tokens=30, eos_token_id=None, tree="default")
        assert out.token_ids == ref[:30]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_a_plain_step_over_the_slots_in_use_needs_no_mask(arch, models, monkeypatch):
    """Over the slots in use (a CPU), slot s is position s: a one-token step passes no 4D mask, and the
    cache does not claim to be compileable, so HF skips the mask too (as for its own decoding step);
    a whole-buffer cache must hide its stale slots, so it passes one. Both give the cache-free logits."""
    model = models[arch]
    target = TargetModel(model)
    seen = []
    real = target.base.forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attention_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(target.base, "forward", spy)
    prompt = [5, 9, 2, 7]
    for fixed in (False, True):
        cache = kv_cache.new_cache(model, 64)
        cache.fixed_shapes = fixed
        target.forward(torch.tensor(prompt[:3]), cache)
        seen.clear()
        h = target.forward(torch.tensor(prompt[3:]), cache)
        assert kv_cache.hides_slots(cache) is fixed and cache.is_compileable is fixed
        assert (seen[0] is not None) is fixed  # a 4D mask only where stale slots must be hidden
        torch.testing.assert_close(target.logits(h[-1]), naive_logits(model, prompt), atol=1e-5, rtol=0)
