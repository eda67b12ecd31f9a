"""specdec.draft_tree: buffers of a hand-drawn tree, candidates, presets, best_tree."""
from __future__ import annotations

import itertools

import pytest
import torch

from specdec.draft_tree import (PRESETS, Tree, best_tree, build_tree, candidates, expected_length, graft_chain,
                                merge_chain, resolve_tree)

# The hand-drawn tree (node index: path):
#
#   0: ()  root
#   ├── 1: (0,)
#   │   ├── 3: (0, 0)
#   │   │   └── 6: (0, 0, 0)
#   │   └── 4: (0, 1)
#   └── 2: (1,)
#       └── 5: (1, 0)
HAND = [(1, 0), (0, 0, 0), [0, 1], (1,), (0,), (0, 0), (0,)]  # scrambled, a list and a duplicate


@pytest.fixture
def hand() -> Tree:
    return resolve_tree(HAND, num_heads=4)


def test_hand_tree_structure(hand):
    assert hand.paths == ((), (0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert hand.num_nodes == 7 and hand.max_depth == 3
    assert hand.parent == (-1, 0, 0, 1, 1, 2, 3)
    assert hand.depth == (0, 1, 1, 2, 2, 2, 3)
    assert hand.depth_t.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert hand.rank == (-1, 0, 1, 0, 1, 0, 0)
    assert hand.children == ((1, 2), (3, 4), (5,), (6,), (), (), ())
    assert hand.topk == (2, 2, 1)


def test_hand_tree_ancestor_mask(hand):
    want = torch.tensor([
        # 0  1  2  3  4  5  6
        [1, 0, 0, 0, 0, 0, 0],  # 0
        [1, 1, 0, 0, 0, 0, 0],  # 1
        [1, 0, 1, 0, 0, 0, 0],  # 2
        [1, 1, 0, 1, 0, 0, 0],  # 3
        [1, 1, 0, 0, 1, 0, 0],  # 4
        [1, 0, 1, 0, 0, 1, 0],  # 5
        [1, 1, 0, 1, 0, 0, 1],  # 6
    ], dtype=torch.bool)
    assert hand.ancestor_mask.dtype == torch.bool
    assert torch.equal(hand.ancestor_mask, want)


def test_trees_of_one_shape_share_their_mask_and_each_mask_is_its_ancestors():
    """Rank paths that differ only in ranks share one topology's buffers; every mask is the brute-force one."""
    a = build_tree(((0,), (1,), (0, 0), (0, 0, 0)))
    b = build_tree(((0,), (3,), (0, 2), (0, 2, 1)))  # same parents, other ranks
    c = build_tree(((0,), (1,), (1, 0), (1, 0, 0)))  # the chain hangs under the other child
    assert a.ancestor_mask is b.ancestor_mask and a.depth_t is b.depth_t
    assert a.rank != b.rank and a.tree_indices.tolist() != b.tree_indices.tolist()
    assert not torch.equal(a.ancestor_mask, c.ancestor_mask)
    for tree in (a, b, c, build_tree(PRESETS["default"]), graft_chain(((0,), (1,)), 1, 3)):
        for i in range(tree.num_nodes):
            seen, j = set(), i
            while j >= 0:
                seen.add(j)
                j = tree.parent[j]
            assert tree.ancestor_mask[i].nonzero().flatten().tolist() == sorted(seen)
            assert tree.depth_t[i] == tree.depth[i] == len(seen) - 1


def test_hand_tree_indices(hand):
    # flat candidates: [root, h0 r0, h0 r1, h1 r0, h1 r1, h2 r0]
    assert hand.tree_indices.tolist() == [0, 1, 2, 3, 4, 3, 5]


def test_candidates_fill_the_tree_from_each_heads_topk(hand):
    V = 10
    head_logits = torch.full((4, V), -5.0)
    head_logits[0, [7, 2]] = torch.tensor([3.0, 2.0])  # head 0: rank 0 = 7, rank 1 = 2
    head_logits[1, [4, 9]] = torch.tensor([1.0, 0.5])  # head 1: rank 0 = 4, rank 1 = 9
    head_logits[2, 5] = 8.0  # head 2: rank 0 = 5
    tokens, q = candidates(42, head_logits, hand)
    assert tokens.tolist() == [42, 7, 2, 4, 9, 4, 5]
    probs = torch.softmax(head_logits, -1)
    want_q = [1.0, probs[0, 7], probs[0, 2], probs[1, 4], probs[1, 9], probs[1, 4], probs[2, 5]]
    torch.testing.assert_close(q, torch.tensor([float(x) for x in want_q]))
    assert q.dtype == torch.float32
    # siblings never repeat a token (the verifier relies on it)
    for kids in hand.children:
        toks = [tokens[c].item() for c in kids]
        assert len(set(toks)) == len(toks)


@pytest.mark.parametrize("paths,match", [
    ([(0, 0)], "parent"),
    ([(0,), (0, 1, 0)], "parent"),
    ([()], "non-empty"),
    ([(0,), (-1,)], "ranks"),
    ([(0,), (1.0,)], "ranks"),
    ([(0,), ("a",)], "ranks"),
])
def test_invalid_paths_raise(paths, match):
    with pytest.raises(ValueError, match=match):
        resolve_tree(paths, num_heads=4)


def test_checked_paths_skip_validation_only_when_told_so():
    paths = ((0,), (1,), (0, 0))
    assert build_tree(paths, checked=True) is build_tree(paths)  # the same cached tree either way
    with pytest.raises(ValueError, match="parent"):
        build_tree(((0, 0),))  # unchecked paths are validated
    with pytest.raises(ValueError, match="`checked` must be True or False"):
        build_tree(paths, checked="yes")


def test_unknown_preset_and_trained_without_tree_raise():
    with pytest.raises(ValueError, match="unknown tree preset"):
        resolve_tree("bushy")
    with pytest.raises(ValueError, match="trained"):
        resolve_tree("trained", trained=None)
    assert resolve_tree("trained", trained=((0,), (1,))).paths == ((), (0,), (1,))


def test_truncation_to_the_number_of_heads(hand):
    t = resolve_tree(HAND, num_heads=2)
    assert t.max_depth == 2 and t.num_nodes == 6
    assert hand.truncated(1).paths == ((), (0,), (1,))
    assert build_tree(PRESETS["default"]).truncated(2).max_depth == 2


@pytest.mark.parametrize("K", [1, 2, 3, 4, 5])
def test_chain_preset_has_depth_K(K):
    t = resolve_tree("chain", num_heads=K)
    assert t.paths == tuple((0,) * d for d in range(K + 1))
    assert t.max_depth == K and t.num_nodes == K + 1
    assert t.children[K] == () and all(t.children[d] == (d + 1,) for d in range(K))
    assert torch.equal(t.ancestor_mask, torch.ones(K + 1, K + 1, dtype=torch.bool).tril())


def test_small_and_default_presets():
    small, default = build_tree(PRESETS["small"]), build_tree(PRESETS["default"])
    assert 14 <= small.num_nodes <= 18  # about 16 with the root
    assert 60 <= default.num_nodes <= 68  # about 64 with the root
    assert build_tree(PRESETS["chain"]).num_nodes == 5
    for t in (small, default):
        assert t.max_depth <= 4  # one head per level, 4 heads by default
        assert t.paths[0] == ()
        # every non-root node's parent is in the tree, BFS order (parent index < child index)
        assert all(0 <= t.parent[i] < i for i in range(1, t.num_nodes))
        assert resolve_tree("default" if t is default else "small").paths == t.paths


def brute_force_best(acc: list[list[float]], budget: int) -> float:
    """Best expected length over every parent-closed set of `budget` paths."""
    all_paths = [p for d in range(1, len(acc) + 1) for p in itertools.product(*[range(len(a)) for a in acc[:d]])]
    best = 0.0
    for subset in itertools.combinations(all_paths, budget):
        s = set(subset)
        if all(len(p) == 1 or p[:-1] in s for p in s):
            best = max(best, expected_length(subset, acc))
    return best


@pytest.mark.parametrize("acc", [
    [[0.6, 0.3], [0.5, 0.2], [0.4, 0.1]],
    [[0.3, 0.6, 0.05], [0.9, 0.05], [0.1]],  # ranks out of order: not a simple "rank 0 first"
    [[0.5, 0.5], [1.0, 0.0], [0.7, 0.7]],  # ties and zeros
])
@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5])
def test_best_tree_is_optimal(acc, budget):
    paths = best_tree(acc, budget)
    assert len(paths) == budget
    build_tree(paths)  # a valid tree: every parent present
    assert expected_length(paths, acc) == pytest.approx(brute_force_best(acc, budget))


def test_best_tree_edge_cases():
    acc = [[0.6, 0.3], [0.5]]
    assert best_tree(acc, 1) == ((0,),)
    assert len(best_tree(acc, 100)) == 4  # only 4 paths exist: 2 + 2 * 1
    with pytest.raises(ValueError, match="budget"):
        best_tree(acc, 0)
    assert expected_length((), acc) == 1.0
    assert expected_length(((0,), (0, 0)), acc) == pytest.approx(1 + 0.6 + 0.3)


# -- grafting a chain into the tree ---------------------------------------------------

def test_graft_chain_buffers():
    base = build_tree(((0,), (1,), (0, 0)))  # root, (0), (1), (0,0): N = 4
    t = graft_chain(base.paths[1:], 1, 3)  # three lookup nodes below node 1
    assert t.num_nodes == 7 and t.lookup == (4, 5, 6)
    assert t.parent == (-1, 0, 0, 1, 1, 4, 5)
    assert t.depth == (0, 1, 1, 2, 2, 3, 4) and t.depth_t.tolist() == list(t.depth)
    assert t.children[1] == (4, 3)  # the lookup chain is tried first
    assert t.children[4] == (5,) and t.children[6] == ()
    for i in range(7):  # the mask is exactly "j is i or an ancestor of i"
        anc, j = set(), i
        while j != -1:
            anc.add(j)
            j = t.parent[j]
        assert {j for j in range(7) if t.ancestor_mask[i, j]} == anc
    assert t.rank[4:] == (-1, -1, -1)
    assert graft_chain(base.paths[1:], 1, 3) is t  # cached
    with pytest.raises(ValueError, match="attach"):
        graft_chain(base.paths[1:], 9, 2)


def test_merge_chain_follows_matching_nodes():
    tree = build_tree(((0,), (1,), (0, 0), (0, 1)))  # root 0, (0)=1, (1)=2, (0,0)=3, (0,1)=4
    tokens = [10, 11, 12, 13, 14]
    assert merge_chain(tree, tokens, [11, 14, 7, 8]) == (4, [7, 8])
    assert merge_chain(tree, tokens, [12, 5]) == (2, [5])
    assert merge_chain(tree, tokens, [9]) == (0, [9])
    assert merge_chain(tree, tokens, [11, 13]) == (3, [])


def test_tree_preset_none_is_the_root_alone():
    t = resolve_tree("none")
    assert t.num_nodes == 1 and t.children == ((),)


# -- through the engine: exactness --------------------------------------------------------
