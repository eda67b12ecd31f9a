"""Statistical losslessness: speculative sampling follows the exact filtered target law.

A tiny model with V = 10 tokens lets us enumerate the exact law of the
first two emitted tokens, p(t1) p(t2 | t1), with temperature, top-k, top-p
and min-p all active, computed in float64 by the reference sampler in
conftest (independent of specdec.sampler). We then draw thousands of
seeded samples and compare with a chi-square test:

- `verify` called directly on fixed logits (a faithful mirror of one or two
  engine rounds: real model logits at every tree node, candidates from
  fixed draft logits through `draft_tree.candidates`), for the chain, the
  default tree, and the default tree cut to depth 1 (as the engine cuts it
  near max_new_tokens; its leaves make bonus tokens common);
- the engine end to end (real forwards, random heads), also with prompt
  lookup drafting (its chain alone, and merged into the heads' tree);
- negative controls: planted bugs (a verifier that always accepts, a
  verification path that ignores top-p, Medusa's lossy typical acceptance)
  must make the same test fail with p < 1e-6.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import specdec
import specdec.verifier as verifier_mod
from conftest import make_model, naive_logits, reference_probs
from specdec import kv_cache
from specdec.draft_tree import candidates, resolve_tree
from specdec.sampler import SamplingParams, target_probs
from specdec.target import TargetModel
from specdec.verifier import verify

V = 10
CONTEXT = [3, 1, 4, 1]  # committed tokens, in the cache
ROOT = 5  # the pending token: the root of the first round's tree
PARAMS = SamplingParams(temperature=1.5, top_k=6, top_p=0.92, min_p=0.05)
FILTERS = dict(temperature=1.5, top_k=6, top_p=0.92, min_p=0.05)
N_DIRECT = 4000  # samples per direct test (about 1-2 ms each)
N_CONTROL = 1000  # samples per negative control: planted bugs fail by a wide margin
N_ENGINE = 2000  # samples per end-to-end test (about 6 ms each)
N_PLAIN = 1000
PASS_P = 1e-3  # a correct sampler fails this about once in 1000 seeds; our seeds are fixed
FAIL_P = 1e-6  # what a planted bug must reach


@pytest.fixture(scope="module")
def model():
    return make_model("llama", vocab=V, seed=3, init=0.2)


def exact_law(model, prefix: list[int]) -> np.ndarray:
    """Filtered target law of the next token after `prefix`, float64 reference. [V]"""
    p, margin = reference_probs(naive_logits(model, prefix), **FILTERS)
    # no keep/drop decision may sit on a float32 rounding edge, or support could differ
    assert margin > 1e-4, f"borderline filter decision after {prefix}: margin {margin}"
    return p.numpy()


def exact_joint(model, prefix: list[int]) -> np.ndarray:
    """[V, V] exact law of the next two tokens after `prefix`."""
    p1 = exact_law(model, prefix)
    return np.stack([p1[a] * exact_law(model, prefix + [a]) if p1[a] > 0 else np.zeros(V) for a in range(V)])


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one."""
    counts, probs = counts.ravel().astype(float), probs.ravel()
    n = counts.sum()
    exp = probs / probs.sum() * n
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big).any():
        obs_b.append(counts[~big].sum())
        exp_b.append(max(exp[~big].sum(), 1e-9))  # observations in a zero-probability cell blow up chi-square
    obs_b, exp_b = np.array(obs_b), np.array(exp_b)
    exp_b *= obs_b.sum() / exp_b.sum()
    return float(chisquare(obs_b, exp_b).pvalue)


def ignore_top_p(logits, params):
    """A planted bug: the verification path drops the top-p filter."""
    return target_probs(logits, params.replace(top_p=1.0))


# -- the direct mirror of one engine round -------------------------------------------

class Rounds:
    """Precomputed tree logits for round 1 (root ROOT) and every possible round 2 (root t1)."""

    def __init__(self, model, tree_name: str) -> None:
        name, _, depth = tree_name.partition("@")
        self.tree = resolve_tree(name, num_heads=4)
        if depth:  # what the engine uses near max_new_tokens; depth-1 leaves make bonus tokens frequent
            self.tree = self.tree.truncated(int(depth))
        self.target = TargetModel(model)
        g = torch.Generator().manual_seed(1234)
        # fixed random draft logits per root: the candidates a head would propose
        self.first = self._round(CONTEXT, ROOT, torch.randn(4, V, generator=g) * 2)
        self.second = {t: self._round(CONTEXT + [ROOT], t, torch.randn(4, V, generator=g) * 2) for t in range(V)}

    def _round(self, context, root, head_logits):
        tokens, _ = candidates(root, head_logits, self.tree)  # [N]
        cache = kv_cache.new_cache(self.target.model)
        self.target.forward(torch.tensor(context), cache)
        hidden = self.target.forward(tokens, cache, self.tree.ancestor_mask, self.tree.depth_t)  # [N, H]
        return tokens.tolist(), self.target.logits(hidden)  # [N], [N, V]

    def emit(self, round_data, params, rule, gen) -> list[int]:
        tokens, logits = round_data
        uniforms = torch.rand(self.tree.max_depth + 1, generator=gen, dtype=torch.float64).tolist()
        v = verify(tokens, self.tree, lambda i: logits[i], params, rule, uniforms)
        return [tokens[i] for i in v.accepted[1:]] + [v.next_token]

    def sample_two(self, params, rule, gen) -> tuple[int, int]:
        out = self.emit(self.first, params, rule, gen)
        if len(out) < 2:  # only a correction: the next round, rooted at it, gives t2
            out += self.emit(self.second[out[0]], params, rule, gen)
        return out[0], out[1]


def draw(rounds: Rounds, n: int, seed: int, params=PARAMS, rule="lossless") -> np.ndarray:
    """Counts [V, V] of the first two emitted tokens over n seeded runs."""
    gen = torch.Generator().manual_seed(seed)
    counts = np.zeros((V, V))
    for _ in range(n):
        a, b = rounds.sample_two(params, rule, gen)
        counts[a, b] += 1
    return counts


# The quick loop draws from the default tree; the full suite adds the chain and the tree cut to depth 1.
@pytest.fixture(scope="module", params=["default", pytest.param("chain", marks=pytest.mark.slow),
                                        pytest.param("default@1", marks=pytest.mark.slow)])
def rounds(request, model):
    return Rounds(model, request.param)


@pytest.fixture(scope="module")
def joint(model):
    return exact_joint(model, CONTEXT + [ROOT])


def test_setup_is_meaningful(model, rounds, joint):
    """Filters must cut, drafts must sometimes be accepted, and the tree logits must be the model's."""
    for i in range(rounds.tree.num_nodes):
        path, j = [], i
        while j != -1:
            path.append(rounds.first[0][j])
            j = rounds.tree.parent[j]
        torch.testing.assert_close(rounds.first[1][i], naive_logits(model, CONTEXT + path[::-1]), atol=1e-5, rtol=0)
    p_filtered = exact_law(model, CONTEXT + [ROOT])
    p_raw, _ = reference_probs(naive_logits(model, CONTEXT + [ROOT]), temperature=1.5)
    assert (p_filtered > 0).sum() < (p_raw > 0).sum() == V
    no_top_p, _ = reference_probs(naive_logits(model, CONTEXT + [ROOT]), 1.5, 6, 1.0, 0.05)
    assert (no_top_p.numpy() > 0).sum() > (p_filtered > 0).sum(), "top-p must matter for the negative control"
    assert (joint > 0).sum() >= 16
    # the draft candidates include likely tokens: some rounds accept a drafted token
    gen = torch.Generator().manual_seed(0)
    lengths = [len(rounds.emit(rounds.first, PARAMS, "lossless", gen)) for _ in range(300)]
    assert max(lengths) >= 2 and min(lengths) == 1


def test_verify_is_lossless(rounds, joint, record_property):
    counts = draw(rounds, N_DIRECT, seed=2024)
    assert counts[joint == 0].sum() == 0, "emitted a pair the filtered target law forbids"
    p = chi2_pvalue(counts, joint)
    record_property("pvalue", p)
    print(f"\n[{rounds.tree.num_nodes}-node tree] direct verify chi-square p = {p:.4g}")
    assert p > PASS_P


def always_accept(real):
    """A planted bug: the verifier accepts the first child the filters allow, whatever token the target drew."""
    def draw(p, u, kids=()):
        tok, px, pt = real(p, u, kids)
        allowed = [k for k, x in zip(kids, px) if x > 0]
        return (allowed[0], px, px[kids.index(allowed[0])]) if allowed else (tok, px, pt)
    return draw


def test_negative_control_always_accept(rounds, joint, monkeypatch):
    """A verifier that accepts any candidate the filters allow is not lossless."""
    monkeypatch.setattr(verifier_mod, "draw", always_accept(verifier_mod.draw))
    counts = draw(rounds, N_CONTROL, seed=2024)
    p = chi2_pvalue(counts, joint)
    print(f"\n[{rounds.tree.num_nodes}-node tree] always-accept control p = {p:.4g}")
    assert p < FAIL_P


def test_negative_control_verifier_ignores_top_p(rounds, joint, monkeypatch):
    """The pitfall vLLM shipped: a verification path that drops one filter."""
    monkeypatch.setattr(verifier_mod, "target_probs", ignore_top_p)
    counts = draw(rounds, N_CONTROL, seed=2024)
    p = chi2_pvalue(counts, joint)
    print(f"\n[{rounds.tree.num_nodes}-node tree] ignore-top-p control p = {p:.4g}")
    assert p < FAIL_P


def test_negative_control_typical_acceptance_is_lossy(rounds, joint):
    counts = draw(rounds, N_CONTROL, seed=2024, rule="typical")
    p = chi2_pvalue(counts, joint)
    print(f"\n[{rounds.tree.num_nodes}-node tree] typical (lossy) control p = {p:.4g}")
    assert p < FAIL_P


def test_chi2_helper_detects_a_small_bias():
    """The test has power: a 4-point shift on one cell of a 20-cell law is caught at N_DIRECT samples."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(20))
    bias = probs.copy()
    bias[0] += 0.04
    bias /= bias.sum()
    assert chi2_pvalue(rng.multinomial(N_DIRECT, probs).astype(float), probs) > PASS_P
    assert chi2_pvalue(rng.multinomial(N_DIRECT, bias).astype(float), probs) < FAIL_P


# -- end to end through the engine -------------------------------------------------

def engine_counts(model, tree: str, n: int, seed0: int, prefix_cache=None, graphs: bool = False,
                  heads_dtype=None, rule: str = "lossless",
                  packed_rows: bool = False) -> np.ndarray:
    """Counts of (t2, t3): the first two tokens of the first speculative round.

    graphs: run every forward through `specdec.graphs` (recorded replays of captured forwards on the CPU).
    heads_dtype: draft with heads of their own vocabulary projections, stored in this dtype.
    packed_rows: the target's rows for a round's nodes in one prepacked oneDNN product (specdec.packed).
    """
    heads = "random"
    if heads_dtype is not None:
        from specdec.heads import random_heads
        heads = random_heads(model, shared_lm_head=False, seed=0)
    loaded = specdec.load(model, heads=heads, device="cpu", prefix_cache=prefix_cache, heads_dtype=heads_dtype,
                          packed_rows=packed_rows)
    if graphs:
        assert loaded.engine.target.use_graphs("recorded")
    counts = np.zeros((V, V))
    prompt = CONTEXT + [ROOT]
    accepted = []  # drafted tokens accepted in round 1
    for i in range(n):
        params = PARAMS.replace(seed=seed0 + i)
        events = list(loaded.engine.stream(prompt, 4, params, tree=tree, eos_token_id=None, acceptance=rule))
        toks = [t.token_id for e in events for t in e.emitted]
        assert len(toks) == 4
        assert events[1].nodes, "round 1 must be a tree round"
        accepted.append(len(events[1].accepted_path) - 1)
        counts[toks[1], toks[2]] += 1
    # the heads' drafts are accepted often enough for the test to exercise acceptance at depth 1 and 2
    assert np.mean(np.array(accepted) >= 1) > 0.2 and np.mean(np.array(accepted) == 2) > 0.05
    return counts


def assert_follows(counts: np.ndarray, law: np.ndarray, label: str) -> None:
    """Nothing the law forbids was emitted, and the counts fit it (chi-square p > PASS_P)."""
    assert counts[law == 0].sum() == 0
    p = chi2_pvalue(counts, law)
    print(f"\n[{label}] chi-square p = {p:.4g}")
    assert p > PASS_P


@pytest.fixture(scope="module")
def joint_after_first(model):
    """Exact law of (t2, t3) after the prompt, t1 marginalised out. [V, V]"""
    prompt = CONTEXT + [ROOT]
    p1 = exact_law(model, prompt)
    return sum(p1[a] * exact_joint(model, prompt + [a]) for a in range(V) if p1[a] > 0)


@pytest.mark.slow  # a statistical run
@pytest.mark.parametrize("tree", ["default", "chain"])
def test_engine_is_lossless(model, joint_after_first, tree):
    counts = engine_counts(model, tree, N_ENGINE, seed0=10_000)
    assert_follows(counts, joint_after_first, f"engine, {tree}")


@pytest.mark.slow
def test_engine_through_graphs_is_lossless(model, joint_after_first):
    """The captured-forward path (pooled buffer, padded buckets, mask built from device inputs)."""
    counts = engine_counts(model, "default", N_ENGINE, seed0=30_000, graphs=True)
    assert_follows(counts, joint_after_first, "engine, graphs")


@pytest.mark.slow
def test_graphs_negative_control_tree_rows_as_a_chain(model, joint_after_first, monkeypatch):
    """Planted bug in the graph path: the tree's ancestor rows staged as a causal chain."""
    from specdec import captured

    staged = captured.Forward.__call__
    monkeypatch.setattr(captured.Forward, "__call__",
                        lambda self, rows: staged(self, [(ids, past, None, depth) for ids, past, _, depth in rows]))
    counts = engine_counts(model, "default", N_CONTROL, seed0=30_000, graphs=True)
    p = chi2_pvalue(counts, joint_after_first)
    print(f"\n[engine, graphs] chain-rows control p = {p:.4g}")
    assert p < FAIL_P


@pytest.mark.slow
def test_engine_with_half_precision_heads_is_lossless(model, joint_after_first):
    """Heads whose vocabulary projections are fp16 (what `specdec.load` picks on a fast-fp16 CPU) only draft."""
    counts = engine_counts(model, "default", N_ENGINE, seed0=40_000, heads_dtype="float16")
    assert_follows(counts, joint_after_first, "engine, fp16 heads")


@pytest.mark.slow
def test_half_precision_heads_negative_control_ignores_top_p(model, joint_after_first, monkeypatch):
    monkeypatch.setattr(verifier_mod, "target_probs", ignore_top_p)
    counts = engine_counts(model, "default", N_ENGINE, seed0=40_000, heads_dtype="float16")
    p = chi2_pvalue(counts, joint_after_first)
    print(f"\n[engine, fp16 heads] ignore-top-p control p = {p:.4g}")
    assert p < FAIL_P


@pytest.mark.slow
def test_engine_negative_control_ignores_top_p(model, joint_after_first, monkeypatch):
    monkeypatch.setattr(verifier_mod, "target_probs", ignore_top_p)
    counts = engine_counts(model, "default", 2 * N_ENGINE, seed0=10_000)
    p = chi2_pvalue(counts, joint_after_first)
    print(f"\n[engine, default] ignore-top-p control p = {p:.4g}")
    assert p < FAIL_P


@pytest.mark.slow  # a statistical run
def test_plain_mode_is_lossless(model, joint):
    """speculative=False samples the same law (same sampler, one token per round)."""
    loaded = specdec.load(model, heads=None, device="cpu")
    counts = np.zeros((V, V))
    for i in range(N_PLAIN):
        toks = specdec.generate(loaded, prompt_ids=CONTEXT + [ROOT], max_new_tokens=2, speculative=False,
                                eos_token_id=None, seed=i, **FILTERS).token_ids
        counts[toks[0], toks[1]] += 1
    assert counts[joint == 0].sum() == 0
    p = chi2_pvalue(counts, joint)
    print(f"\n[plain] chi-square p = {p:.4g}")
    assert p > PASS_P


# -- end to end with prompt lookup ---------------------------------------------------

LOOKUP_PROMPT = list(range(V)) + [ROOT]  # every token occurs once: any t1 has a lookup proposal


def lookup_counts(model, mode: str, n: int, seed0: int) -> tuple[np.ndarray, float]:
    """Counts of (t2, t3), the first two tokens of round 1, and how often round 1 accepted a lookup node.

    "merge" uses the chain tree: the 64-node tree already holds most 3-token paths of a 10-token
    vocabulary, so a merged lookup chain would rarely add nodes to it.
    """
    loaded = specdec.load(model, heads="random", device="cpu")
    counts = np.zeros((V, V))
    grafted = lookup_hits = 0
    for i in range(n):
        params = PARAMS.replace(seed=seed0 + i)
        events = list(loaded.engine.stream(LOOKUP_PROMPT, 4, params, tree="default" if mode == "first" else "chain",
                                           eos_token_id=None, lookup=3, lookup_mode=mode))
        toks = [t.token_id for e in events for t in e.emitted]
        nodes = events[1].nodes
        grafted += any(nd.source == "lookup" for nd in nodes)
        lookup_hits += any(nodes[j].source == "lookup" for j in events[1].accepted_path[1:])
        counts[toks[1], toks[2]] += 1
    assert grafted > n / 2, "most first rounds must carry lookup nodes"
    return counts, lookup_hits / n


@pytest.fixture(scope="module")
def joint_after_first_lookup(model):
    p1 = exact_law(model, LOOKUP_PROMPT)
    return sum(p1[a] * exact_joint(model, LOOKUP_PROMPT + [a]) for a in range(V) if p1[a] > 0)


@pytest.mark.slow  # a long statistical run
@pytest.mark.parametrize("mode", ["first", "merge"])
def test_engine_with_lookup_is_lossless(model, joint_after_first_lookup, mode):
    counts, hit = lookup_counts(model, mode, N_ENGINE, seed0=20_000)
    assert hit > 0.05, f"lookup drafts must be accepted often enough to matter (got {hit:.2f})"
    assert counts[joint_after_first_lookup == 0].sum() == 0
    p = chi2_pvalue(counts, joint_after_first_lookup)
    print(f"\n[engine + lookup, {mode}] chi-square p = {p:.4g}, lookup accepted in {hit:.0%} of rounds")
    assert p > PASS_P


def dynamic_lookup_counts(model, n: int, seed0: int) -> tuple[np.ndarray, dict[int, set[int]]]:
    """Counts of (t2, t3) on the dynamic tree drafting prompt lookup alone, and round 1's chain lengths by t1.

    The policy calibrates chains by the length of the n-gram they follow. After LOOKUP_PROMPT (ending in
    ROOT = 5), t1 = 6 makes a 2-gram match ("5 6" occurred) and every other t1 a 1-gram match; at the
    cost below the priors draft one chain token after a 1-gram and two after a 2-gram. So round 1's
    tree depends on t1, a token sampled by the prefill.
    """
    from specdec.cost import CostModel

    counts = np.array([1, 2, 4, 8, 16, 32, 64])
    loaded = specdec.load(model, heads=None, device="cpu")
    loaded.engine.set_cost_model(CostModel(tuple(counts), tuple((1.0 + 0.15 * counts) / 1e3), 0.0, 0.0))
    out, chains = np.zeros((V, V)), {}
    for i in range(n):
        events = list(loaded.engine.stream(LOOKUP_PROMPT, 4, PARAMS.replace(seed=seed0 + i), tree="auto", lookup=3,
                                           eos_token_id=None))
        toks = [t.token_id for e in events for t in e.emitted]
        chains.setdefault(toks[0], set()).add(sum(nd.source == "lookup" for nd in events[1].nodes))
        out[toks[1], toks[2]] += 1
    return out, chains


@pytest.mark.slow  # a long statistical run
def test_dynamic_tree_with_lookup_calibrated_by_match_length_is_lossless(model, joint_after_first_lookup):
    counts, chains = dynamic_lookup_counts(model, N_ENGINE, seed0=21_000)
    assert chains.get(6) == {2} and {1} in [chains[t] for t in chains if t != 6], \
        f"round 1's chain must follow the match length of the sampled t1, got {chains}"
    assert counts[joint_after_first_lookup == 0].sum() == 0
    p = chi2_pvalue(counts, joint_after_first_lookup)
    print(f"\n[engine, dynamic tree + lookup by match length] chi-square p = {p:.4g}, chains {chains}")
    assert p > PASS_P


@pytest.fixture
def lookup_always_accepted(monkeypatch):
    """A planted bug: lookup drafts accepted without the test (as if p/q were ignored)."""
    real = verifier_mod.verify

    def accept_lookup(tokens, tree, logits_at, params, rule, uniforms, **kw):
        if not tree.lookup:
            return real(tokens, tree, logits_at, params, rule, uniforms, **kw)
        # The chain hangs from the root ("first" mode, or a dynamic tree of lookup alone). Take all of it,
        # then a bonus token from p.
        tok, _, _ = verifier_mod.draw(target_probs(logits_at(tree.lookup[-1]), params), uniforms[len(tree.lookup)])
        return verifier_mod.Verdict((0,) + tree.lookup, tok, "bonus", 0.0, {}, ())

    import specdec.engine as engine_mod
    monkeypatch.setattr(engine_mod, "verify", accept_lookup)


@pytest.mark.slow
def test_dynamic_tree_with_lookup_negative_control_always_accept(model, joint_after_first_lookup,
                                                                 lookup_always_accepted):
    """The same runs with the planted bug of `lookup_always_accepted` must fail."""
    counts, _ = dynamic_lookup_counts(model, N_CONTROL, seed0=21_000)
    p = chi2_pvalue(counts, joint_after_first_lookup)
    print(f"\n[engine, dynamic tree + lookup] always-accept control p = {p:.4g}")
    assert p < FAIL_P


@pytest.mark.slow  # a long statistical run
def test_engine_with_lookup_negative_control_always_accept(model, joint_after_first_lookup, lookup_always_accepted):
    """The planted bug of `lookup_always_accepted` must fail."""
    counts, _ = lookup_counts(model, "first", N_CONTROL, seed0=20_000)
    p = chi2_pvalue(counts, joint_after_first_lookup)
    print(f"\n[engine + lookup] always-accept control p = {p:.4g}")
    assert p < FAIL_P


# -- a sliding-window model (Mistral), with the prefix cache on: windows and reused prefixes together ---

@pytest.fixture(scope="module")
def window_model():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=16, initializer_range=0.2, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(3)
    return MistralForCausalLM(cfg).float().eval()


@pytest.fixture(scope="module")
def window_joint(window_model):
    prompt = CONTEXT + [ROOT]
    p1 = exact_law(window_model, prompt)
    return sum(p1[a] * exact_joint(window_model, prompt + [a]) for a in range(V) if p1[a] > 0)


@pytest.mark.slow  # a long statistical run
def test_sliding_window_model_with_prefix_cache_is_lossless(window_model, window_joint):
    from specdec.prefix_cache import PrefixCache

    cache = PrefixCache(min_tokens=1)  # every request after the first starts from a cached prefix
    counts = engine_counts(window_model, "default", N_ENGINE, seed0=30_000, prefix_cache=cache)
    assert cache.hits == N_ENGINE - 1
    assert counts[window_joint == 0].sum() == 0
    p = chi2_pvalue(counts, window_joint)
    print(f"\n[engine, sliding window + prefix cache] chi-square p = {p:.4g}")
    assert p > PASS_P


@pytest.mark.slow  # a long statistical run
def test_sliding_window_negative_control_ignores_the_filters(window_model, window_joint, monkeypatch):
    """A planted bug: verification on the raw softmax (no temperature, no filters) must fail."""
    monkeypatch.setattr(verifier_mod, "target_probs", lambda logits, params: torch.softmax(logits.float(), -1))
    counts = engine_counts(window_model, "default", N_CONTROL, seed0=30_000)
    p = chi2_pvalue(counts, window_joint)
    print(f"\n[engine, sliding window] no-filters control p = {p:.4g}")
    assert p < FAIL_P


@pytest.mark.slow
def test_engine_with_packed_rows_is_lossless(model, joint_after_first):
    """Every node's row from one prepacked oneDNN product: still exactly the target's law."""
    from specdec import packed

    if not packed.available(model.get_output_embeddings()):
        pytest.skip("this PyTorch has no oneDNN")
    calls = []
    real = packed.PackedProjection.__call__
    with pytest.MonkeyPatch.context() as mp:  # the sampled rounds really read their rows from the packed product
        mp.setattr(packed.PackedProjection, "__call__", lambda self, x: calls.append(x.shape[0]) or real(self, x))
        counts = engine_counts(model, "default", N_ENGINE, seed0=70_000, packed_rows=True)
    assert calls and max(calls) > 1
    assert_follows(counts, joint_after_first, "engine, packed rows")


@pytest.mark.slow
def test_packed_rows_negative_control_typical_acceptance(model, joint_after_first):
    """The same packed rows under Medusa's lossy typical acceptance: the test sees the bias."""
    from specdec import packed

    if not packed.available(model.get_output_embeddings()):
        pytest.skip("this PyTorch has no oneDNN")
    counts = engine_counts(model, "default", N_CONTROL, seed0=70_000, packed_rows=True, rule="typical")
    p = chi2_pvalue(counts, joint_after_first)
    print(f"\n[engine, packed rows] typical (lossy) control p = {p:.4g}")
    assert p < FAIL_P
