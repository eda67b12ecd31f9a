"""specdec.kv_cache: rollback keeps exactly the accepted path (a gather, not a crop)."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPTS, make_model, naive_logits, oracle_loaded
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


def test_crop_snapshot_restore(llama):
    cache = synthetic_cache(llama, 4, 6)
    saved = kv_cache.snapshot(cache, 8)
    assert kv_cache.nbytes(saved) == 2 * 2 * (1 * 2 * 8 * 8) * 4  # layers x (k, v) x elements x fp32
    kv_cache.crop(cache, 3)
    assert kv_cache.length(cache) == 3
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

        def spy(model):
            cache = real(model)
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
            for got, want in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=0)
                torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=0)
    assert len(spy.caches) == 1
    assert partial_non_contiguous >= 2, "the test must exercise non-contiguous rollbacks"
    assert out == ref[:n]
    plain = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=n, speculative=False, eos_token_id=None)
    assert plain.token_ids == out


def test_attention_layout_reads_windows_and_refuses_recurrent_layers():
    from transformers import Gemma2Config, LlamaConfig, MambaConfig, MistralConfig, Qwen2Config, Qwen3NextConfig

    assert kv_cache.attention_layout(LlamaConfig()).window is None
    assert kv_cache.attention_layout(MistralConfig()).window == 4096  # Mistral-7B-v0.1's default window
    layout = kv_cache.attention_layout(Gemma2Config(sliding_window=300, num_hidden_layers=4))
    assert layout.types == ("sliding_attention", "full_attention") * 2
    assert layout.windows == (300, None, 300, None) and layout.window == 300
    assert kv_cache.attention_layout(Qwen2Config(use_sliding_window=False)).window is None
    assert kv_cache.attention_layout(Qwen2Config(use_sliding_window=True, sliding_window=64)).window == 64
    for cfg in (Qwen3NextConfig(), MambaConfig()):
        with pytest.raises(ValueError, match="'linear_attention' layers"):
            kv_cache.attention_layout(cfg)
