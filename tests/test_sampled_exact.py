"""Seeded sampling is exact: a speculative request emits the very tokens plain sampling draws with its seed.

Each output position has its own uniform (`sampler.position_uniforms`), and lossless verification
draws the target's token at a node from that position's uniform, then accepts the child that matches
it (`verifier.verify`). So whatever drafted the tokens (heads on any tree, the dynamic policy, prompt
lookup, a batch of other requests), the output must equal `speculative=False` token for token, on
three architectures, with every filter on. This is stronger than the chi-square tests in
test_lossless.py over one property and weaker over another: equality with our own plain sampler says
nothing about whether that sampler follows the filtered law, which is what those tests check.

Oracle heads that know the plain run's continuation make drafts land: with a seeded hit pattern they
are accepted along long paths, and rejected and corrected at random depths.
"""
from __future__ import annotations

import pytest

import specdec
import specdec.verifier as verifier_mod
from bench.oracle import OracleHeads
from conftest import ARCHS, PROMPTS, make_model
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec.scheduler import Scheduler
from test_tree_policy import FREE, MODERATE

N = 20
LAWS = (SamplingParams(temperature=0.9, top_k=30, top_p=0.9, min_p=0.02), SamplingParams(temperature=1.3))
SEEDS = range(3)


def tokens(engine, request) -> list[int]:
    return [t.token_id for e in engine.stream(request) for t in e.emitted]


def drafted_share(engine, request) -> float:
    """The share of a run's tokens that were accepted drafts (not the target's own)."""
    kinds = [t.kind for e in engine.stream(request) for t in e.emitted]
    return kinds.count("accepted") / len(kinds)


@pytest.fixture(scope="module")
def oracles(models):
    out = {}
    for arch in ARCHS:
        heads = OracleHeads(models[arch], accuracy=0.75, seed=1)
        loaded = specdec.load(models[arch], heads=heads, device="cpu")
        loaded.engine.set_cost_model(FREE)  # nodes cost nothing: the dynamic tree drafts wherever a draft may land
        out[arch] = loaded
    return out


def plain_then_oracle(loaded, prompt, params, key) -> tuple[list[int], GenerationRequest]:
    """The plain run's tokens, with the oracle heads set to draft exactly that continuation."""
    want = tokens(loaded.engine, GenerationRequest(prompt, N, params, speculative=False, eos_token_id=None))
    loaded.engine.heads.begin(prompt + want + [0] * 6, key=key)
    return want, GenerationRequest(prompt, N, params, eos_token_id=None)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree,lookup", [("chain", 0), ("default", 0), ("auto", 0), ("auto", 6), ("none", 6)])
def test_speculative_sampling_emits_the_plain_runs_tokens(arch, tree, lookup, oracles):
    loaded = oracles[arch]
    share = []
    for law in LAWS:
        for s in SEEDS:
            for prompt in PROMPTS:
                params = law.replace(seed=100 * s + len(prompt))
                want, request = plain_then_oracle(loaded, prompt, params, key=s)
                request = GenerationRequest(prompt, N, params, tree=tree, lookup=lookup, eos_token_id=None)
                assert tokens(loaded.engine, request) == want, (tree, lookup, law, s, prompt)
                share.append(drafted_share(loaded.engine, request))
    if tree != "none":  # lookup alone drafts only where the sampled text repeats
        assert sum(share) / len(share) > 0.3, "drafts must be accepted often for the equality to mean much"


def test_random_heads_on_a_small_vocabulary_give_the_plain_tokens_too():
    """No oracle: real (random) heads whose drafts a 10-token vocabulary accepts and rejects by chance."""
    model = make_model("llama", vocab=10, seed=3, init=0.2)
    loaded = specdec.load(model, heads="random", device="cpu")
    share = []
    for s in range(12):
        params = SamplingParams(temperature=1.5, top_k=6, top_p=0.92, min_p=0.05, seed=s)
        plain = tokens(loaded.engine, GenerationRequest([3, 1, 4, 1, 5], N, params, speculative=False, eos_token_id=None))
        for tree in ("default", "chain"):
            request = GenerationRequest([3, 1, 4, 1, 5], N, params, tree=tree, eos_token_id=None)
            assert tokens(loaded.engine, request) == plain, (s, tree)
            share.append(drafted_share(loaded.engine, request))
    assert sum(share) / len(share) > 0.2


def test_a_batch_of_sampled_requests_emits_each_ones_plain_tokens(models):
    """Mixed laws, seeds and lengths in one batch, greedy members included: each request its own plain tokens."""
    loaded = specdec.load(models["qwen2"], heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    requests = [GenerationRequest(p, N - 4 * (k % 3), LAWS[k % 2].replace(seed=k) if k % 4 != 3 else SamplingParams(),
                                  tree=("auto", "default")[k % 2], lookup=6 * (k % 2), eos_token_id=None)
                for k, p in enumerate(PROMPTS * 3)]
    with Scheduler(loaded.engine, max_batch_size=4) as sched:
        tickets = [sched.submit(r) for r in requests]
        got = [[t.token_id for e in tk for t in e.emitted] for tk in tickets]
        assert max(sched.stats()["batch_sizes"]) > 1
    for r, toks in zip(requests, got):
        plain = GenerationRequest(r.prompt_ids, r.max_new_tokens, r.params, speculative=False, eos_token_id=None)
        assert toks == tokens(loaded.engine, plain)


def test_a_seed_means_the_same_tokens_under_any_cost_model(models):
    """The dynamic tree's size follows the cost model, which a running engine may refresh; its tokens may not."""
    loaded = specdec.load(models["llama"], heads="random", device="cpu")
    request = GenerationRequest(PROMPTS[1], N, LAWS[0].replace(seed=7), tree="auto", lookup=6, eos_token_id=None)
    runs = []
    for cost in (MODERATE, MODERATE.__class__((1, 64), (1e-3, 1e-3), 1e-5, 1e-5)):  # CPU-like, then free nodes
        loaded.engine.set_cost_model(cost)
        runs.append(([len(e.nodes) for e in loaded.engine.stream(request)], tokens(loaded.engine, request)))
    assert runs[0][0] != runs[1][0], "the two cost models must draft different trees"
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("bug", ["next position's uniform", "tree nodes unfiltered"])
def test_negative_control_a_planted_bug_breaks_the_equality(bug, oracles, monkeypatch):
    """The equality has power: verification with the wrong position's uniform, or with a law at tree
    nodes that keeps what the filters cut, must change most runs' tokens."""
    if bug == "next position's uniform":
        import specdec.engine as engine_mod
        real_verify = verifier_mod.verify

        def shifted(tokens_, tree, logits_at, params, rule, uniforms, **kw):
            if tree.num_nodes > 1:  # plain rounds keep theirs: only the tree rounds are wrong
                uniforms = list(uniforms[1:]) + [0.5]
            return real_verify(tokens_, tree, logits_at, params, rule, uniforms, **kw)
        monkeypatch.setattr(engine_mod, "verify", shifted)
    else:
        real_draw = verifier_mod.draw

        def unfiltered(p, u, kids=()):
            if kids:  # a node with children: a tree round's, never the plain reference's
                p = p.clone()
                p[p == 0] = p[p > 0].min() / 2
            return real_draw(p, u, kids)
        monkeypatch.setattr(verifier_mod, "draw", unfiltered)
    loaded, mismatches = oracles["llama"], 0
    for s in SEEDS:
        for prompt in PROMPTS:
            params = LAWS[0].replace(seed=100 * s + len(prompt))
            want, _ = plain_then_oracle(loaded, prompt, params, key=s)
            request = GenerationRequest(prompt, N, params, tree="default", eos_token_id=None)
            mismatches += tokens(loaded.engine, request) != want
    assert mismatches >= 3, f"{bug}: only {mismatches} of 9 runs differed"
