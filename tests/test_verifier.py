"""specdec.verifier on a hand-drawn tree with hand-made logits (exact cases).

The statistical checks of the lossless rule live in test_lossless.py.
"""
from __future__ import annotations

import pytest
import torch

from specdec.draft_tree import build_tree
from specdec.sampler import SamplingParams
from specdec.verifier import ACCEPTANCE_RULES, LOSSY_RULES, verify

V = 8
#   0 (root)
#   ├── 1 (rank 0) ── 3 (rank 0) ── 6 (rank 0)
#   │             └── 4 (rank 1)
#   └── 2 (rank 1) ── 5 (rank 0)
TREE = build_tree(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
TOKENS = [7, 1, 2, 3, 4, 3, 5]  # node -> token
SAMPLING = SamplingParams(temperature=1.0)


def fresh(gen: torch.Generator) -> list[float]:
    """One uniform per depth of any tree here, new from `gen` at each call (a request's position uniforms)."""
    return torch.rand(8, generator=gen, dtype=torch.float64).tolist()


def onehot_logits(best: dict[int, int]) -> dict[int, torch.Tensor]:
    """node -> [V] logits with +100 on the target's choice and -100 elsewhere."""
    out = {}
    for node in range(TREE.num_nodes):
        row = torch.full((V,), -100.0)
        row[best.get(node, 0)] = 100.0
        out[node] = row
    return out


class Probe:
    """logits_at that records which nodes the verifier asked for."""

    def __init__(self, rows: dict[int, torch.Tensor]) -> None:
        self.rows, self.asked = rows, []

    def __call__(self, node: int) -> torch.Tensor:
        self.asked.append(node)
        return self.rows[node]


@pytest.mark.parametrize("rule,params", [("greedy", SamplingParams()), ("lossless", SAMPLING),
                                         ("typical", SAMPLING)])
@pytest.mark.parametrize("best,path,next_tok,kind", [
    # target wants 1 after the root, then 3, then 5, then 6: the full leftmost path plus a bonus
    ({0: 1, 1: 3, 3: 5, 6: 6}, (0, 1, 3, 6), 6, "bonus"),
    # 1 then 4 (rank 1 of head 1): a non-contiguous path, then bonus at leaf 4
    ({0: 1, 1: 4, 4: 2}, (0, 1, 4), 2, "bonus"),
    # 2 (rank 1 at the root), then 3 (node 5), then bonus
    ({0: 2, 2: 3, 5: 0}, (0, 2, 5), 0, "bonus"),
    # 1, then something no child has: correction at node 1
    ({0: 1, 1: 6}, (0, 1), 6, "correction"),
    # nothing matches at the root
    ({0: 5}, (0,), 5, "correction"),
    # 1, 3, then not 5: correction at node 3
    ({0: 1, 1: 3, 3: 0}, (0, 1, 3), 0, "correction"),
])
def test_exact_cases(rule, params, best, path, next_tok, kind):
    probe = Probe(onehot_logits(best))
    v = verify(TOKENS, TREE, probe, params, rule, fresh(torch.Generator().manual_seed(0)))
    assert v.accepted == path
    assert v.next_token == next_tok and v.next_kind == kind
    assert v.next_prob == pytest.approx(1.0)
    # logits are only needed along the accepted path
    assert probe.asked == list(path)
    # every child of an accepted node that is not on the path was compared and lost
    for node in path:
        for c in TREE.children[node]:
            if c not in path:
                assert v.target_prob.get(c, 0.0) == pytest.approx(0.0, abs=1e-30)
    for node in path[1:]:
        assert v.target_prob[node] == pytest.approx(1.0)


def test_rejected_children_are_recorded_in_order():
    rows = onehot_logits({0: 2, 2: 6})
    v = verify(TOKENS, TREE, rows.__getitem__, SAMPLING, "lossless", fresh(torch.Generator().manual_seed(0)))
    assert v.accepted == (0, 2) and v.rejected == (1, 5)
    assert v.next_kind == "correction" and v.next_token == 6
    v = verify(TOKENS, TREE, onehot_logits({0: 0}).__getitem__, SAMPLING, "lossless",
               fresh(torch.Generator().manual_seed(0)))
    assert v.rejected == (1, 2) and v.accepted == (0,)


def test_temperature_zero_forces_greedy():
    rows = {n: torch.randn(V, generator=torch.Generator().manual_seed(n)) for n in range(TREE.num_nodes)}
    for rule in ACCEPTANCE_RULES:
        v = verify(TOKENS, TREE, rows.__getitem__, SamplingParams(), rule, ())  # greedy reads no uniform
        assert v.next_token == int(rows[v.accepted[-1]].argmax())


def test_invalid_rule_raises():
    with pytest.raises(ValueError, match="acceptance rule"):
        verify(TOKENS, TREE, onehot_logits({}).__getitem__, SAMPLING, "speculative", ())


@pytest.mark.parametrize("rule", [r for r in ACCEPTANCE_RULES if r != "greedy"])  # the sampling rules
def test_a_rule_is_labelled_lossy_exactly_when_it_changes_the_law(rule):
    """One draft x with p(x) = 0.4: a lossless rule emits x 40% of the time (accepted, or drawn as the
    correction); a lossy one does not, and LOSSY_RULES must say which is which."""
    tree = build_tree(((0,),))
    p = torch.tensor([0.05, 0.05, 0.4, 0.1, 0.1, 0.1, 0.1, 0.1])  # [V]; the draft is token 2
    rows = [p.log(), torch.zeros(V)]
    n, emitted_x = 2000, 0
    for s in range(n):
        v = verify([0, 2], tree, rows.__getitem__, SAMPLING, rule, fresh(torch.Generator().manual_seed(s)))
        emitted_x += v.accepted == (0, 1) or v.next_token == 2  # the first new token is x
    freq = emitted_x / n
    assert (abs(freq - 0.4) > 0.1) == (rule in LOSSY_RULES), (rule, freq)  # 0.1: over 9 standard errors


def test_filters_apply_on_the_verification_path():
    """A candidate removed by top-k / top-p / min-p is never accepted, nor sampled as a correction."""
    row = torch.tensor([0.0, 2.0, 1.9, 1.0, 0.0, -1.0, -2.0, -3.0])  # token 1 best, 2 close second
    rows = {n: row for n in range(TREE.num_nodes)}
    for params in [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=0.3),
                   SamplingParams(temperature=1.0, min_p=0.99)]:
        g = torch.Generator().manual_seed(1)
        for _ in range(200):
            # root children are tokens 1 (node 1) and 2 (node 2); only 1 survives the filter
            v = verify([7, 2, 1, 3, 4, 3, 5], TREE, rows.__getitem__, params, "lossless", fresh(g))
            assert v.accepted[:2] == (0, 2)
            assert v.target_prob[1] == 0.0 and v.target_prob[2] == pytest.approx(1.0)


def test_rejection_renormalises_the_residual():
    """p = [.5, .5, 0, ...] and children (0, 1): child 1 is accepted with prob 1 once 0 is rejected."""
    row = torch.full((V,), float("-inf"))
    row[0] = row[1] = 0.0
    rows = {n: row for n in range(TREE.num_nodes)}
    g = torch.Generator().manual_seed(3)
    firsts = []
    for _ in range(400):
        v = verify([7, 0, 1, 3, 4, 3, 5], TREE, rows.__getitem__, SAMPLING, "lossless", fresh(g))
        assert len(v.accepted) >= 2, "with only tokens 0 and 1 in the support, a root child is always accepted"
        firsts.append(v.accepted[1])
    assert 150 < firsts.count(1) < 250  # about half each


def test_seeded_generator_reproduces_verdicts():
    g = torch.Generator().manual_seed(0)
    rows = {n: torch.randn(V, generator=g) for n in range(TREE.num_nodes)}
    toks = [7] + [int(torch.argsort(rows[TREE.parent[n]], descending=True)[TREE.rank[n]]) for n in range(1, 7)]

    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return [verify(toks, TREE, rows.__getitem__, SAMPLING, "lossless", fresh(gen)) for _ in range(30)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_typical_accepts_by_threshold_not_by_chance():
    # a flat-ish law: high entropy lowers the threshold, a 0.3 candidate passes, a 0.001 one does not
    row = torch.log(torch.tensor([0.001, 0.3, 0.2, 0.2, 0.1, 0.1, 0.098, 0.001]))
    rows = {n: row for n in range(TREE.num_nodes)}
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        v = verify([7, 0, 1, 3, 4, 3, 5], TREE, rows.__getitem__, SAMPLING, "typical", fresh(g))
        assert v.rejected[0] == 1 and v.accepted[1] == 2  # token 0 (p .001) rejected, token 1 (p .3) accepted


@pytest.mark.parametrize("preset", ["chain", "small", "default"])
def test_batched_greedy_verify_equals_row_by_row(preset):
    """Given the same logits rows, verify_greedy's walk (all rows at once) and verify(rule="greedy")
    (rows on demand) agree exactly. (Rounding differences between one [N, H] x [H, V] product and
    single rows are covered by the engine's token-for-token comparisons with HF generate.)"""
    from specdec.draft_tree import graft_chain, resolve_tree
    from specdec.verifier import verify_greedy
    g = torch.Generator().manual_seed(1)
    base = resolve_tree(preset)
    trees = [base, graft_chain(base.paths[1:], 1, 3)]
    for tree in trees:
        for trial in range(50):
            N, V = tree.num_nodes, 12
            logits = torch.randn(N, V, generator=g) * 3
            # tokens that often equal the argmax, so paths are accepted to various depths
            best = logits.argmax(-1)
            tokens = [int(t) for t in torch.randint(0, V, (N,), generator=g)]
            for i in range(1, N):
                if torch.rand((), generator=g) < 0.6:
                    tokens[i] = int(best[tree.parent[i]])
            for i in range(N):  # siblings must carry distinct tokens, as candidates() and merge guarantee
                seen = set()
                for c in tree.children[i]:
                    while tokens[c] in seen:
                        tokens[c] = (tokens[c] + 1) % V
                    seen.add(tokens[c])
            a = verify_greedy(tokens, tree, logits)
            b = verify(tokens, tree, lambda i: logits[i], SamplingParams(), "greedy", ())
            assert (a.accepted, a.next_token, a.next_kind, a.rejected) == (b.accepted, b.next_token, b.next_kind,
                                                                            b.rejected)
            assert a.target_prob.keys() == b.target_prob.keys()
            assert all(abs(a.target_prob[k] - b.target_prob[k]) < 1e-5 for k in a.target_prob)
            assert abs(a.next_prob - b.next_prob) < 1e-5


def test_lossless_accepts_a_child_whenever_children_cover_the_support():
    """If the children hold all of p's mass, some child is accepted at every uniform, even one just
    below 1: the drawn token is the first whose cumulative mass exceeds u * total, so a float32 law
    that sums to 1 only to a few ulp can never send the walk to an empty residual law."""
    tree = build_tree(((0,), (1,)))  # root with two children
    logits = torch.full((3, 8), -30.0)
    logits[0, 5], logits[0, 2] = 9.969826698303223, 0.0  # p(5) ~ 0.99995, p(2) ~ 4.7e-5 under top_k=2
    params = SamplingParams(temperature=1.0, top_k=2)
    for first, second in ((5, 2), (2, 5)):
        for u, want in ((0.0, 2), (1e-5, 2), (1e-4, 5), (0.999999, 5), (1 - 2**-53, 5)):
            v = verify([1, first, second], tree, lambda i: logits[i], params, "lossless", [u, 0.5])
            chosen = 1 if first == want else 2
            assert v.accepted == (0, chosen) and v.rejected == (3 - chosen,), (first, second, u)
            assert v.next_kind == "bonus"