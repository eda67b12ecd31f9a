"""The hindsight study of the dynamic tree's node choice (scripts/tree_order_study.py).

BENCHMARKS.md compares orderings by what their trees would have accepted, so the study's walk and
its replay are checked on hand-made positions where the answer is known, with a planted wrong
continuation as the negative control.
"""
from __future__ import annotations

import pytest

from conftest import load_script

TOP = 10


@pytest.fixture(scope="module")
def study():
    return load_script("tree_order_study")


def ids_with(right: list[tuple[int, int]]) -> list[list[int]]:
    """Head ids [depth][rank]: token 100 + 10 * depth + rank, except (depth, rank) pairs given as right."""
    ids = [[100 + 10 * d + r for r in range(TOP)] for d in range(3)]
    for d, r in right:
        ids[d][r] = 7 + d
    return ids


def test_accepted_walks_the_tree_along_the_true_tokens(study):
    ids = ids_with([(0, 1), (1, 0), (2, 2)])  # the right tokens: rank 1, then rank 0, then rank 2
    truth = [7, 8, 9]
    tree = [(0,), (1,), (1, 0), (1, 1), (1, 0, 0)]
    assert study.accepted(tree, ids, truth) == (2, (1, 0))  # (1, 0, 2) is not in the tree
    assert study.accepted(tree + [(1, 0, 2)], ids, truth) == (3, (1, 0, 2))
    assert study.accepted([(0,), (0, 0)], ids, truth) == (0, ())  # rank 0 is wrong at depth 1
    # planted: a continuation that differs at depth 2 stops the walk there
    assert study.accepted(tree + [(1, 0, 2)], ids, [7, 5, 9]) == (1, (1,))


def test_replay_learns_which_ranks_land_and_steps_past_what_it_accepted(study):
    # Every position: rank 3 is right at every depth, and the heads' q says rank 0 is likeliest.
    q = [[0.5, 0.2, 0.1, 0.05] + [0.01] * (TOP - 4) for _ in range(3)]
    rows = [{"q": q, "ids": ids_with([(0, 3), (1, 3), (2, 3)]), "next": [7, 8, 9]} for _ in range(400)]
    rank_table = study.replay([rows], study.RankOrder(3))
    assert rank_table[4] == pytest.approx(3.0, abs=0.1)  # it learns the (3, 3, 3) chain: 3 drafts a round
    # A rank-blind order that trusts q never finds it within 4 nodes: (0,), (1,), (0, 0) first.
    class Trusting:
        def estimates(self, q):
            return q

        def observe(self, seen):
            pass

    assert study.replay([rows], Trusting())[4] == 0.0
    assert study.replay([rows], Trusting())[24] == 1.0  # rank 3 at depth 1 only, within 24 nodes
