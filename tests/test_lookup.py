"""specdec/lookup.py: the n-gram index and its proposals, and exactness through the engine (grafting: test_draft_tree.py)."""
from __future__ import annotations

import dataclasses

import random

import pytest

import specdec
import specdec.draft_tree as draft_tree_mod
from conftest import ARCHS, PROMPTS, hf_greedy, make_model
from specdec.draft_tree import build_tree
from specdec.drafter import Proposal
from specdec.drafting import merged
from specdec.lookup import DEFAULT_LOOKUP, LOOKUP, NgramIndex
from specdec.request import ROOT_ONLY

N = 32


# -- the n-gram index ------------------------------------------------------------

def brute_propose(tokens: list[int], max_n: int, length: int) -> list[int]:
    """The definition: the latest earlier occurrence of the longest suffix n-gram, copied on (overlapping)."""
    for n in range(min(max_n, len(tokens)), 0, -1):
        suffix = tokens[-n:]
        for end in range(len(tokens) - 2, n - 2, -1):  # ends before the last token
            if tokens[end - n + 1 : end + 1] == suffix:
                out = []
                for j in range(end + 1, end + 1 + length):
                    out.append(tokens[j] if j < len(tokens) else out[j - len(tokens)])
                return out
    return []


def test_propose_examples():
    idx = NgramIndex([1, 2, 3, 4, 1, 2], max_ngram=3)
    assert idx.propose(3) == [3, 4, 1]  # "1 2" occurred at 0-1
    assert idx.propose(0) == []
    assert NgramIndex([7, 8, 9], 3).propose(4) == []  # the suffix never occurred before
    # a short period: the latest match is 2 back, and the copy reads its own output
    assert NgramIndex([5, 6, 5, 6], 2).propose(5) == [5, 6, 5, 6, 5]
    # the longest n-gram wins over a more recent shorter one
    idx = NgramIndex([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 3)
    assert idx.propose(1) == [9]
    assert NgramIndex([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2).propose(1) == [8]  # "2 3": latest earlier end is 5
    with pytest.raises(ValueError, match="lookup_ngram"):
        NgramIndex([1], 0)


def test_match_names_the_length_of_the_ngram_the_chain_follows():
    toks = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3]
    assert NgramIndex(toks, 3).match(2) == ([9, 2], 3)  # "1 2 3" occurred at 0-2
    assert NgramIndex(toks, 2).match(1) == ([8], 2)
    assert NgramIndex([4, 5, 6, 5], 3).match(2) == ([6, 5], 1)  # only "5" occurred before
    assert NgramIndex([7, 8, 9], 3).match(4) == ([], 0)
    assert NgramIndex(toks, 3).match(0) == ([], 0)
    for n in (1, 2, 3):
        idx = NgramIndex(toks, n)
        assert idx.propose(3) == idx.match(3)[0]


def test_the_lookup_drafter_proposes_the_chain_as_a_tree_of_lookup_nodes():
    p = LOOKUP.propose(NgramIndex([1, 2, 3, 4, 1, 2], 3), 7, 4)
    assert (p.tokens, p.tree.parent, p.tree.lookup, p.match, p.source) == ([7, 3, 4, 1, 2], (-1, 0, 1, 2, 3),
                                                                          (1, 2, 3, 4), 2, "lookup")
    assert p.q == [None] * 5  # point-mass drafts
    assert len(LOOKUP.propose(NgramIndex([1, 2, 3, 4, 1, 2], 3), 7, 2).tokens) == 3  # the room bounds the chain
    assert LOOKUP.propose(NgramIndex([7, 8, 9], 3), 9, 4) is None


def test_a_chain_merges_into_a_proposal_as_far_as_it_matches():
    tree = build_tree(((0,), (1,), (0, 0)))  # root, two depth-1 candidates, one depth-2 under the first
    heads = Proposal(tree, [7, 3, 5, 4], [None, 0.5, 0.2, 0.4], "heads")
    chain = LOOKUP.propose(NgramIndex([1, 2, 3, 4, 9, 1, 2], 3), 7, 3)  # 3 4 9: 3 and 4 are in the tree
    tree2, tokens, q = merged(7, heads, chain)
    assert tokens == [7, 3, 5, 4, 9] and q == [None, 0.5, 0.2, 0.4, None]
    assert tree2.parent[4] == 3 and tree2.lookup == (4,)  # 9 grafted under the tree's "3 4"
    alone = merged(7, None, chain)
    assert alone[1] == [7, 3, 4, 9] and alone[0].lookup == (1, 2, 3)
    assert merged(7, heads, None)[1] == heads.tokens and merged(7, None, None)[:2] == (ROOT_ONLY, [7])


def test_incremental_index_matches_the_definition():
    rng = random.Random(0)
    for trial in range(200):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        max_n = rng.randrange(1, 5)
        idx = NgramIndex(toks[:1], max_n)
        i = 1
        while i < len(toks):  # in chunks of 1-5 tokens, as the engine extends it by a round's tokens
            step = rng.randrange(1, 6)
            idx.extend(toks[i : i + step])
            i += step
            assert idx.propose(6) == brute_propose(idx.tokens, max_n, 6), (trial, idx.tokens)
        assert NgramIndex(toks, max_n).propose(6) == brute_propose(toks, max_n, 6)


@pytest.fixture(scope="module")
def repetitive():
    """Per arch: a prompt that repeats a pattern and HF's greedy continuation of it."""
    out = {}
    for arch in ARCHS:
        model = make_model(arch)
        prompt = PROMPTS[0] + PROMPTS[0][:3] + PROMPTS[0]  # repeats: the n-gram index finds matches
        out[arch] = (model, prompt, hf_greedy(model, prompt, N))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree,mode", [("chain", "first"), ("default", "merge"), ("small", "first")])
def test_greedy_with_lookup_equals_hf(arch, tree, mode, repetitive):
    model, prompt, ref = repetitive[arch]
    loaded = specdec.load(model, heads="random", device="cpu")
    out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, tree=tree, lookup=8, lookup_mode=mode,
                           eos_token_id=None)
    assert out.token_ids == ref
    lookup_nodes = [n for r in out.rounds for n in r.nodes if n.source == "lookup"]
    assert lookup_nodes, "lookup must have drafted something on a repetitive prompt"
    assert all(n.rank == -1 and n.draft_prob is None for n in lookup_nodes)
    if mode == "first":  # a round with a lookup chain runs no head nodes
        for r in out.rounds[1:]:
            if any(n.source == "lookup" for n in r.nodes):
                assert all(n.source != "heads" for n in r.nodes)


@pytest.mark.parametrize("arch", ARCHS)
def test_lookup_alone_without_heads(arch, repetitive):
    model, prompt, ref = repetitive[arch]
    loaded = specdec.load(model, heads=None, device="cpu")
    out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, lookup=DEFAULT_LOOKUP, eos_token_id=None)
    assert out.token_ids == ref
    accepted = sum(1 for r in out.rounds for t in r.emitted if t.kind == "accepted")
    assert accepted > 0 and out.stats["target_forwards"] < N + 1
    with pytest.raises(ValueError, match="lookup >= 1"):
        specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=4, lookup=0)


def test_lookup_respects_max_new_tokens_and_context(repetitive, monkeypatch):
    model, prompt, ref = repetitive["llama"]
    loaded = specdec.load(model, heads=None, device="cpu")
    for n in (1, 2, 5, 17):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=n, lookup=16, eos_token_id=None)
        assert out.token_ids == ref[:n]
    # a repetitive prompt 3 tokens short of the context: every chain must be cut to fit
    from specdec.target import TargetModel
    seen, real = [], TargetModel.forward

    def spy(self, input_ids, cache, tree_mask=None, depth=None, taps=False):
        past = specdec.kv_cache.length(cache)
        seen.append(past + (int(depth.max()) if depth is not None else input_ids.shape[0] - 1))
        return real(self, input_ids, cache, tree_mask, depth, taps)

    monkeypatch.setattr(TargetModel, "forward", spy)
    ctx = model.config.max_position_embeddings
    long_prompt = (prompt * (ctx // len(prompt) + 1))[: ctx - 3]
    out = specdec.generate(loaded, prompt_ids=long_prompt, max_new_tokens=50, lookup=16, eos_token_id=None)
    assert max(seen) <= ctx - 1, "a position id beyond the model's context was used"
    assert out.stats["finished"] == "context" and len(long_prompt) + len(out.token_ids) == ctx + 1
    assert out.token_ids[:3] == hf_greedy(model, long_prompt, 3)


def test_negative_control_blind_graft_mask_is_caught(repetitive, monkeypatch):
    """A planted bug (lookup nodes do not attend to the nodes above them) must break exactness."""
    model, prompt, ref = repetitive["llama"]
    real = draft_tree_mod.graft_chain.__wrapped__

    def blind(paths, attach, length):
        t = real(paths, attach, length)
        mask = t.ancestor_mask.clone()
        for i in t.lookup:
            mask[i] = False
            mask[i, i] = True
        return dataclasses.replace(t, ancestor_mask=mask)

    import specdec.drafting as drafting_mod
    monkeypatch.setattr(drafting_mod, "graft_chain", blind)
    loaded = specdec.load(model, heads=None, device="cpu")
    out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, lookup=8, eos_token_id=None)
    assert out.token_ids != ref


def test_lookup_argument_errors(repetitive):
    model, prompt, _ = repetitive["llama"]
    loaded = specdec.load(model, heads="random", device="cpu")
    for kw, name in [(dict(lookup=-1), "lookup"), (dict(lookup=65), "lookup"), (dict(lookup=2.5), "lookup"),
                     (dict(lookup_ngram=0), "lookup_ngram"), (dict(lookup_ngram=9), "lookup_ngram"),
                     (dict(lookup_mode="both"), "lookup_mode")]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            list(loaded.engine.stream(prompt, 4, lookup=kw.get("lookup", 4), **{k: v for k, v in kw.items()
                                                                               if k != "lookup"}))


def test_lookup_is_ignored_without_speculation(repetitive):
    model, prompt, ref = repetitive["llama"]
    loaded = specdec.load(model, heads=None, device="cpu")
    out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=8, speculative=False, lookup=10,
                           eos_token_id=None)
    assert out.token_ids == ref[:8] and out.stats["target_forwards"] == 8
