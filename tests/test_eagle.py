"""The EAGLE-3 drafter: its layer against a hand-written forward, its tree against uncached recomputation,
and exactness wherever it drafts (greedy = HF `generate`, seeded sampling = plain sampling, solo and batched).
"""
from __future__ import annotations

import math

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

import specdec
from conftest import PROMPTS, hf_greedy, make_model
from specdec.eagle import Eagle3, EagleConfig, EagleRun, Shape, default_layers, draft, feed
from specdec.engine import Engine
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec.scheduler import Scheduler
from specdec.target import TargetModel

N = 24


def random_eagle(model, seed: int = 0, std: float = 0.3, draft_vocab: int | None = None) -> Eagle3:
    """A seeded random drafter for `model` (its own draft vocabulary of `draft_vocab` ids when given)."""
    cfg = model.config
    V, H = cfg.vocab_size, cfg.hidden_size
    ec = EagleConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
                     intermediate_size=2 * H, vocab_size=V, draft_vocab_size=draft_vocab or V,
                     layers=default_layers(cfg.num_hidden_layers))
    d = Eagle3(ec, model.get_input_embeddings())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]) * 4)
        if draft_vocab:  # draft id i is target id 2i: d2t[i] = i
            d.d2t.copy_(torch.arange(draft_vocab))
            d.t2d.zero_()
            d.t2d[torch.arange(draft_vocab) * 2] = True
    return d.eval()


class OracleEagle(Eagle3):
    """A test double that knows the continuation: at position t it puts `hit` of its mass on token t + 2 of
    `ref` (the layer still runs, so its cache and masks do too); a seeded share of positions miss."""

    def __init__(self, base: Eagle3, ref: list[int], accuracy: float = 0.8, seed: int = 0) -> None:
        super().__init__(base.config, base.embed[0])
        self.load_state_dict(base.state_dict())
        self.ref, self.accuracy = ref, accuracy
        self.miss = torch.rand(len(ref) + 64, generator=torch.Generator().manual_seed(seed)) > accuracy

    def step(self, tokens, g, positions, cache, visible=None):
        h, logits = super().step(tokens, g, positions, cache, visible)
        out = torch.full_like(logits, -4.0)
        for j, t in enumerate(positions.tolist()):
            want = self.ref[t + 2] if t + 2 < len(self.ref) else 0
            out[j, (want + 1) % logits.shape[-1] if self.miss[t] else want] = 4.0
            out[j, (want + 3) % logits.shape[-1]] = 2.0
        return h, out


def eagle_engine(model, drafter=None, **kw) -> Engine:
    return Engine(TargetModel(model), None, eagle=drafter if drafter is not None else random_eagle(model), **kw)


def greedy(engine, prompt, n=N, **kw) -> list[int]:
    req = GenerationRequest(prompt, n, SamplingParams(temperature=0.0), eos_token_id=None, **kw)
    return [t.token_id for e in engine.stream(req) for t in e.emitted]


# -- the layer and the tree --------------------------------------------------------------------------

def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_logits(d: Eagle3, tokens: list[int], feats: torch.Tensor) -> torch.Tensor:
    """The draft layer over a causal sequence, written from the definitions (positions 0..n-1). -> [n, Vd]"""
    c = d.config
    return reference_forward(d.state_dict(), d.embed[0].weight, tokens, feats, c.num_attention_heads,
                             c.num_key_value_heads, c.rms_norm_eps, c.rope_theta)


def reference_forward(state: dict, embed: torch.Tensor, tokens: list[int], feats: torch.Tensor, nh: int, nkv: int,
                      eps: float, theta: float) -> torch.Tensor:
    """EAGLE-3's layer from a checkpoint's own tensors, named as SafeAILab saves them. -> [n, Vd] float64"""
    sd = {k: v.double() for k, v in state.items() if v.is_floating_point()}
    emb = embed.double()[torch.tensor(tokens)]
    g = feats.double() @ sd["fc.weight"].T
    x = torch.cat([rms(emb, sd["midlayer.input_layernorm.weight"], eps), rms(g, sd["midlayer.hidden_norm.weight"], eps)], -1)
    n, hd = len(tokens), sd["midlayer.self_attn.q_proj.weight"].shape[0] // nh
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(n, nh, hd)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(n, nkv, hd)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(n, nkv, hd)
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]  # [n, hd/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rope(t):
        a, b = t[..., : hd // 2], t[..., hd // 2 :]
        return t * cos + torch.cat([-b, a], -1) * sin

    q, k = rope(q), rope(k)
    rep = nh // nkv
    out = torch.zeros(n, nh, hd, dtype=torch.float64)
    for h in range(nh):
        s = q[:, h] @ k[:, h // rep].T / math.sqrt(hd)  # [n, n]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v[:, h // rep]
    h1 = g + out.reshape(n, -1) @ sd["midlayer.self_attn.o_proj.weight"].T
    m = rms(h1, sd["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(m @ sd["midlayer.mlp.gate_proj.weight"].T) * (m @ sd["midlayer.mlp.up_proj.weight"].T)) \
        @ sd["midlayer.mlp.down_proj.weight"].T
    h2 = h1 + mlp
    return rms(h2, sd["norm.weight"], eps) @ sd["lm_head.weight"].T


def test_the_layer_matches_a_hand_written_forward(llama):
    d = random_eagle(llama, seed=1)
    torch.manual_seed(0)
    toks = [5, 9, 2, 77, 3, 3, 41]
    feats = torch.randn(len(toks), 3 * d.config.feature_size)
    run = EagleRun()
    run.add(feats, toks, position=0)
    with torch.inference_mode():
        _, got = d.step(torch.tensor(toks), d.fuse(feats), torch.arange(len(toks)), run.cache)
    want = reference_logits(d, toks, feats)
    assert torch.allclose(got.double(), want, atol=1e-4), (got.double() - want).abs().max()
    # The negative control: a layer that attends to the future differs.
    with torch.inference_mode():
        _, wrong = d.step(torch.tensor(toks), d.fuse(feats), torch.arange(len(toks)), None,
                          torch.ones(len(toks), len(toks), dtype=torch.bool))
    assert not torch.allclose(wrong.double(), want, atol=1e-3)


def node_logits(d: Eagle3, ctx_toks, ctx_feats, path_toks) -> torch.Tensor:
    """The drafter's logits after the committed context and a path of drafted tokens, recomputed without any
    cache or tree mask: each drafted position reads the previous position's output. -> [Vd]"""
    with torch.inference_mode():
        h, logits = d.step(torch.tensor(ctx_toks), d.fuse(ctx_feats), torch.arange(len(ctx_toks)), None)
        g, toks = d.fuse(ctx_feats), list(ctx_toks)
        last_h, last = h[-1], logits[-1]
        for t in path_toks:  # the sequence grows by one position whose feature is the last output
            g = torch.cat([g[: len(toks)], last_h[None]])
            toks = toks + [t]
            h, logits = _chain(d, toks, g)
            last_h, last = h[-1], logits[-1]
    return last


def _chain(d, toks, g):
    """A causal pass where each position's feature is given as is (no cache)."""
    return d.step(torch.tensor(toks), g, torch.arange(len(toks)), None)


def test_every_tree_node_is_what_an_uncached_pass_gives(llama):
    """The tree's masks, positions and cache truncation: each drafted node's q is its parent's law, as a
    cache-free recomputation along its path gives it; and a second round drafts from the truncated cache."""
    d = random_eagle(llama, seed=2)
    torch.manual_seed(1)
    ctx = [5, 9, 2, 77, 3, 3, 41, 8]
    feats = torch.randn(len(ctx), 3 * d.config.feature_size)
    run = EagleRun()
    run.add(feats, ctx, position=0)
    root = ctx[-1]
    for _ in range(2):  # the second draft must not see the first one's tree entries
        grown = draft(d, run, root, budget=12, depth=4, top_k=3)
        tree = grown.tree
        assert run.cache.length == len(ctx)
        assert tree.num_nodes == 13 and tree.max_depth >= 3
        for i in range(1, tree.num_nodes):
            path, p = [], tree.parent[i]
            while p > 0:
                path.insert(0, grown.tokens[p])
                p = tree.parent[p]
            law = torch.softmax(node_logits(d, ctx, feats, path), -1)
            assert law[grown.tokens[i]].item() == pytest.approx(grown.q[i], abs=1e-4)
        assert grown.q[1] == max(grown.q[j] for j in tree.children[0])  # siblings in draft order


def test_tree_ranks_best_nodes_by_cumulative_probability(llama):
    d = random_eagle(llama, seed=3)
    run = EagleRun()
    run.add(torch.randn(6, 3 * d.config.feature_size), [1, 2, 3, 4, 5, 6], position=0)
    small = draft(d, run, 6, budget=3, depth=3, top_k=3)
    big = draft(d, run, 6, budget=9, depth=3, top_k=3)
    score = lambda g, i: math.prod(g.q[j] for j in _ancestry(g.tree, i))  # noqa: E731
    kept = sorted(score(small, i) for i in range(1, small.tree.num_nodes))
    others = sorted(score(big, i) for i in range(1, big.tree.num_nodes))
    assert kept == pytest.approx(others[-3:])  # the 3-node tree is the big tree's best 3


def _ancestry(tree, i):
    out = []
    while i > 0:
        out.append(i)
        i = tree.parent[i]
    return out


def test_a_reduced_draft_vocabulary_maps_to_target_ids(llama):
    d = random_eagle(llama, seed=4, draft_vocab=40)
    run = EagleRun()
    run.add(torch.randn(4, 3 * d.config.feature_size), [1, 2, 3, 4], position=0)
    grown = draft(d, run, 4, budget=10, depth=3, top_k=3)
    assert all(t % 2 == 0 and t < 80 for t in grown.tokens[1:])


def test_shape_and_bad_layers_are_refused(llama):
    with pytest.raises(ValueError, match="budget"):
        Shape(budget=0)
    d = random_eagle(llama)
    object.__setattr__(d.config, "layers", (1, 2, 9))
    with pytest.raises(ValueError, match="has 2 layers"):
        eagle_engine(llama, d)


# -- exactness ---------------------------------------------------------------------------------------

def mistral():
    cfg = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        sliding_window=None, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None)
    torch.manual_seed(0)
    m = MistralForCausalLM(cfg).float().eval()
    m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    return m


TARGETS = {"llama": lambda models: models["llama"], "qwen2": lambda models: models["qwen2"],
           "mistral": lambda models: mistral()}


@pytest.mark.parametrize("arch", list(TARGETS))
def test_greedy_equals_hf_generate(arch, models):
    model = TARGETS[arch](models)
    for prompt in PROMPTS:
        want = hf_greedy(model, prompt, N)
        oracle = OracleEagle(random_eagle(model), prompt + want + [0] * 8, accuracy=0.7)
        engine = eagle_engine(model, oracle)
        events = list(engine.stream(GenerationRequest(prompt, N, SamplingParams(temperature=0.0), eos_token_id=None)))
        assert [t.token_id for e in events for t in e.emitted] == want
        assert max(len(e.accepted_path) for e in events) >= 4  # long paths were accepted
        assert any(n.source == "eagle3" and n.status == "rejected" for e in events for n in e.nodes)
        # A random drafter (drafts rarely land) and one merged with prompt lookup stay exact too.
        assert greedy(eagle_engine(model), prompt) == want
        assert greedy(engine, prompt, lookup=3, lookup_mode="merge") == want


def test_negative_control_a_commit_keeping_a_wrong_row_is_caught(llama, monkeypatch):
    """The planted bug: the commit keeps the KV row after the last accepted node instead of its own. Greedy
    output must then differ from HF's, or the test above proves nothing."""
    from specdec import kv_cache

    prompt = PROMPTS[1]
    want = hf_greedy(llama, prompt, N)
    oracle = OracleEagle(random_eagle(llama), prompt + want + [0] * 8, accuracy=0.7)
    keep = kv_cache.keep_path
    monkeypatch.setattr(kv_cache, "keep_path", lambda cache, start, path: keep(
        cache, start, path[:-1] + [path[-1] + 1] if len(path) > 1 else path))
    assert greedy(eagle_engine(llama, oracle), prompt) != want


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_seeded_sampling_emits_plain_samplings_tokens(arch, models):
    model = models[arch]
    params = SamplingParams(temperature=0.9, top_k=30, top_p=0.9, min_p=0.02, seed=7)
    for prompt in PROMPTS:
        engine = eagle_engine(model)
        plain = [t.token_id for e in engine.stream(GenerationRequest(prompt, N, params, speculative=False,
                                                                     eos_token_id=None)) for t in e.emitted]
        oracle = OracleEagle(random_eagle(model), prompt + plain + [0] * 8, accuracy=0.8)
        events = list(eagle_engine(model, oracle).stream(GenerationRequest(prompt, N, params, eos_token_id=None)))
        assert [t.token_id for e in events for t in e.emitted] == plain
        assert sum(t.kind == "accepted" for e in events for t in e.emitted) >= N // 3


def test_a_batch_of_eagle_requests_stays_exact(models):
    """Through the scheduler: several requests share rounds, each drafting its own tree, greedy and sampled."""
    model = models["llama"]
    engine = eagle_engine(model)
    params = SamplingParams(temperature=1.1, seed=3)
    reqs, want = [], []
    for i, prompt in enumerate(PROMPTS * 2):
        if i % 2:
            reqs.append(GenerationRequest(prompt, N, params.replace(seed=i), eos_token_id=None))
            want.append([t.token_id for e in engine.stream(GenerationRequest(prompt, N, params.replace(seed=i),
                                                                             speculative=False, eos_token_id=None))
                         for t in e.emitted])
        else:
            reqs.append(GenerationRequest(prompt, N, SamplingParams(temperature=0.0), eos_token_id=None))
            want.append(hf_greedy(model, prompt, N))
    with Scheduler(engine, max_batch_size=4) as sched:
        tickets = [sched.submit(r) for r in reqs]
        got = [[t.token_id for e in tk.result(timeout=60) for t in e.emitted] for tk in tickets]
    assert got == want


def test_load_takes_an_eagle_drafter_and_a_request_can_pick_its_drafter(llama):
    loaded = specdec.load(llama, heads="random", device="cpu")
    engine = Engine(loaded.engine.target, loaded.heads, eagle=random_eagle(llama))
    assert engine.default_drafter == "eagle3"
    prompt = PROMPTS[0]
    want = hf_greedy(llama, prompt, N)
    for drafter in ("medusa", "eagle3"):
        req = GenerationRequest(prompt, N, SamplingParams(temperature=0.0), eos_token_id=None, drafter=drafter)
        events = list(engine.stream(req))
        assert [t.token_id for e in events for t in e.emitted] == want
        sources = {n.source for e in events for n in e.nodes} - {"root"}
        assert sources == {"heads" if drafter == "medusa" else "eagle3"}
    with pytest.raises(ValueError, match="drafter"):
        GenerationRequest(prompt, N, drafter="hydra")
    with pytest.raises(ValueError, match="'eagle3' needs"):
        loaded.engine.stream(GenerationRequest(prompt, N, drafter="eagle3"))
    with pytest.raises(ValueError, match="`tree` must be 'auto', 'trained' or 'none'"):
        engine.stream(GenerationRequest(prompt, N, tree="chain", drafter="eagle3"))


# -- training ----------------------------------------------------------------------------------------

def test_training_time_test_sees_what_an_inference_tree_node_sees(llama):
    """Step j of the unrolled training pass at position t gives the logits of the depth-j node whose path is
    the true tokens, as inference drafts it (its context, its ancestors' own outputs, itself)."""
    from specdec.train.eagle import unrolled

    d = random_eagle(llama, seed=5)
    torch.manual_seed(2)
    T = 12
    seq = torch.randint(0, 128, (1, T))
    feats = torch.randn(1, T, 3 * d.config.feature_size)
    with torch.no_grad():
        steps = unrolled(d, feats, seq, 4)
    s = seq[0].tolist()
    for j in range(4):
        for t in range(j, T - 1):
            want = node_logits(d, s[1 : t - j + 2], feats[0, : t - j + 1], s[t - j + 2 : t + 2])
            assert torch.allclose(steps[j][0, t], want, atol=1e-4), (j, t)
    # The negative control: step 1 reading the target's state instead of its own output differs.
    wrong = node_logits(d, s[1:6], feats[0, :5], [])
    assert not torch.allclose(steps[1][0, 5], wrong, atol=1e-3)


def test_the_drafter_sees_the_same_context_solo_batched_and_chunked(models):
    """The drafter's trees are a function of the committed context: a request decoded alone, in a batch whose
    round 0 is shared, and with its prompt fed in chunks drafts the same trees (its feeding loses nothing)."""
    model = models["llama"]
    engine = eagle_engine(model, random_eagle(model, seed=7))
    prompt = [(i * 37 + 11) % 128 for i in range(40)]
    req = lambda p: GenerationRequest(p, 12, SamplingParams(temperature=0.0), eos_token_id=None)  # noqa: E731

    def trees(events):
        return [[n.token_id for n in e.nodes] for e in events]

    solo = trees(engine.stream(req(prompt)))
    assert sum(len(t) for t in solo) > 20
    others = [PROMPTS[0] * 5, PROMPTS[1] * 3]
    for chunk in (None, 8):
        kw = {} if chunk is None else {"prefill_chunk": chunk}
        with Scheduler(engine, max_batch_size=4, **kw) as sched:
            tickets = [sched.submit(req(p)) for p in [prompt] + others]
            got = [trees(t.result(timeout=60)) for t in tickets]
            assert sched.idle(timeout=10)
        assert got[0] == solo, chunk
    # The negative control: a drafter that forgets the prompt drafts other trees.
    from specdec import eagle as eagle_mod

    forget = eagle_mod.EagleRun.add

    def add(self, rows, tokens, position=None):
        if position is not None:  # the prompt's rows
            rows, tokens, position = rows[-1:], tokens[-1:] if len(tokens) == rows.shape[0] else [], position + rows.shape[0] - 1
        forget(self, rows, tokens, position)

    eagle_mod.EagleRun.add = add
    try:
        assert trees(engine.stream(req(prompt))) != solo
    finally:
        eagle_mod.EagleRun.add = forget


# -- the law, by chi-square ------------------------------------------------------------------------------

def eagle_counts(model, n: int, seed0: int, drafter) -> tuple:
    """Counts of (t2, t3), the first two tokens of the first drafted round, with an EAGLE-3 drafter."""
    import numpy as np

    import test_lossless as tl

    engine = eagle_engine(model, drafter)
    counts, accepted, prompt = np.zeros((tl.V, tl.V)), [], tl.CONTEXT + [tl.ROOT]
    for i in range(n):
        req = GenerationRequest(prompt, 4, tl.PARAMS.replace(seed=seed0 + i), eos_token_id=None, drafter="eagle3")
        events = list(engine.stream(req))
        toks = [t.token_id for e in events for t in e.emitted]
        assert len(toks) == 4 and events[1].nodes
        accepted.append(len(events[1].accepted_path) - 1)
        counts[toks[1], toks[2]] += 1
    return counts, np.array(accepted)


@pytest.fixture(scope="module")
def small():
    """test_lossless's 10-token model, its exact law of (t2, t3), and a random EAGLE-3 drafter for it."""
    import test_lossless as tl

    model = make_model("llama", vocab=tl.V, seed=3, init=0.2)
    prompt = tl.CONTEXT + [tl.ROOT]
    p1 = tl.exact_law(model, prompt)
    joint = sum(p1[a] * tl.exact_joint(model, prompt + [a]) for a in range(tl.V) if p1[a] > 0)
    return model, joint, random_eagle(model, seed=11, std=0.5)


@pytest.mark.slow
def test_eagle_trees_keep_the_law(small):
    """Lossless sampling over EAGLE-2 trees (deep, ranks with gaps, grown from a sampled root)."""
    import test_lossless as tl

    model, joint, drafter = small
    counts, accepted = eagle_counts(model, tl.N_ENGINE, 70_000, drafter)
    assert (accepted >= 1).mean() > 0.2 and (accepted >= 2).mean() > 0.05  # drafts land at depth 1 and 2
    tl.assert_follows(counts, joint, "engine, EAGLE-3 trees")


@pytest.mark.slow
def test_eagle_negative_control_a_tree_forward_that_sees_siblings(small, monkeypatch):
    """The planted bug: EAGLE-3 rounds run the target over the tree as a causal chain (every node sees the nodes
    before it, siblings included). The law must then fail."""
    import test_lossless as tl

    from dataclasses import replace

    model, joint, drafter = small
    real = Engine.forward

    def chain(self, run, draft):
        if draft is not None and draft.tree.num_nodes > 1:
            n = draft.tree.num_nodes
            draft = replace(draft, tree=replace(draft.tree, ancestor_mask=torch.ones(n, n, dtype=torch.bool).tril_()))
        return real(self, run, draft)

    monkeypatch.setattr(Engine, "forward", chain)
    counts, _ = eagle_counts(model, tl.N_CONTROL, 70_000, drafter)
    p = tl.chi2_pvalue(counts, joint)
    print(f"\n[EAGLE-3] siblings-visible control p = {p:.4g}")
    assert p < tl.FAIL_P


def test_captured_graphs_serve_the_heads_while_eagle_rounds_run_eagerly(models):
    """With CUDA graphs (their CPU stand-in), a model holding both drafters replays captured forwards for the
    heads' requests and runs EAGLE-3's rounds (which need the tapped states) eagerly; both stay exact, alone
    and sharing a batch."""
    model = models["llama"]
    loaded = specdec.load(model, heads="random", device="cpu")
    target = loaded.engine.target
    assert target.use_graphs("recorded")
    engine = Engine(target, loaded.heads, eagle=random_eagle(model, seed=2), default_drafter="medusa")
    replays = []
    real = target.graphs.forward
    target.graphs.forward = lambda *a: replays.append(1) or real(*a)
    want = {tuple(p): hf_greedy(model, p, N) for p in PROMPTS}
    for drafter in ("medusa", "eagle3"):
        replays.clear()
        for p in PROMPTS:
            assert greedy(engine, p, drafter=drafter, tree="trained" if drafter == "eagle3" else "default") == want[tuple(p)]
        assert (len(replays) > 0) == (drafter == "medusa"), drafter
    reqs = [GenerationRequest(p, N, SamplingParams(temperature=0.0), eos_token_id=None, drafter=d)
            for p in PROMPTS for d in ("medusa", "eagle3")]
    with Scheduler(engine, max_batch_size=4) as sched:
        got = [[t.token_id for e in t_.result(timeout=60) for t in e.emitted] for t_ in [sched.submit(r) for r in reqs]]
        assert sched.idle(timeout=10)
    assert got == [want[tuple(r.prompt_ids)] for r in reqs]
