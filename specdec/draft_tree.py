"""The draft tree as data: rank paths in, every buffer a round needs out.

Paths are per-head top-k ranks, Medusa style: `(0,)` is head 0's best guess, `(0, 1)` head 1's second
guess after it. Node 0 is the root, the token the target chose last round.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np
import torch

Path = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """Buffers for one static tree with N nodes (root included), depth D."""

    paths: tuple[Path, ...]  # N paths, BFS order, paths[0] == ()
    parent: tuple[int, ...]  # N, parent node index; -1 for the root
    depth: tuple[int, ...]  # N, 0 for the root
    rank: tuple[int, ...]  # N, top-k rank within its head; -1 for the root
    children: tuple[tuple[int, ...], ...]  # N, child node indices in rank order
    topk: tuple[int, ...]  # D, how many candidates head d needs (max rank + 1)
    tree_indices: torch.Tensor  # [N] long, index into [root, head0 top-k, head1 top-k, ...]
    ancestor_mask: torch.Tensor  # [N, N] bool, node i may attend to node j
    depth_t: torch.Tensor  # [N] long, position offset of each node
    # Prompt-lookup nodes (`graft_chain`), in chain order after the head nodes: they have no rank path.
    lookup: tuple[int, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def truncated(self, max_depth: int) -> "Tree":
        """The tree cut below max_depth; grafted lookup nodes are dropped, so graft after truncating."""
        return build_tree(tuple(p for p in self.paths[1:] if len(p) <= max_depth))


def _validate(paths) -> tuple[Path, ...]:
    out: set[Path] = set()
    for p in paths:
        p = tuple(p)
        if not p or any((not isinstance(r, int)) or r < 0 for r in p):
            raise ValueError(f"tree path {p!r} must be a non-empty tuple of ranks >= 0")
        out.add(p)
    for p in out:
        if len(p) > 1 and p[:-1] not in out:
            raise ValueError(f"tree path {p!r} has no parent path {p[:-1]!r} in the tree")
    return tuple(sorted(out, key=lambda p: (len(p), p)))


def build_tree(paths: tuple[Path, ...], checked: bool = False) -> Tree:
    """Build all buffers from a tuple of rank paths (root excluded).

    Args:
        checked: the paths are int tuples, prefix-closed and sorted by (depth, path): skip validation.
    """
    if not isinstance(checked, bool):
        raise ValueError(f"`checked` must be True or False, got {checked!r}")
    # Validate before the cache: (1.0,) == (1,) and hashes alike, so a cached lookup would let it through.
    return _build(paths if checked else _validate(paths))


@lru_cache(maxsize=1024)
def _build(body: tuple[Path, ...]) -> Tree:
    nodes: tuple[Path, ...] = ((),) + body
    index = {p: i for i, p in enumerate(nodes)}
    N = len(nodes)
    parent = tuple(-1 if not p else index[p[:-1]] for p in nodes)
    depth = tuple(len(p) for p in nodes)
    rank = tuple(-1 if not p else p[-1] for p in nodes)
    kids: list[list[int]] = [[] for _ in range(N)]
    for i in range(1, N):
        kids[parent[i]].append(i)
    children = tuple(tuple(sorted(c, key=lambda j: rank[j])) for c in kids)
    D = max(depth)
    topk = tuple(max((p[-1] for p in body if len(p) == d), default=-1) + 1 for d in range(1, D + 1))
    offsets = [1]  # flat candidates: [root] + head0 top-k0 + head1 top-k1 + ...
    for k in topk:
        offsets.append(offsets[-1] + k)
    tree_indices = torch.tensor([0] + [offsets[len(p) - 1] + p[-1] for p in body], dtype=torch.long)
    return Tree(nodes, parent, depth, rank, children, topk, tree_indices, *_shape(parent))


@lru_cache(maxsize=4096)
def _shape(parent: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """A topology's ancestor mask [N, N] and depths [N], shared (read-only) by every tree of that shape.

    Args:
        parent: [N] parent indices; parents must precede their children.
    """
    depth = [0] * len(parent)
    for i in range(1, len(parent)):
        depth[i] = depth[parent[i]] + 1
    return _ancestor_mask(parent, max(depth)), torch.tensor(depth, dtype=torch.long)


def _ancestor_mask(parent: tuple[int, ...], max_depth: int) -> torch.Tensor:
    """[N, N] bool: node i sees itself and its ancestors; NumPy, as a torch call costs more than this work."""
    N = len(parent)
    up = np.maximum(np.asarray(parent, dtype=np.int64), 0)  # [N]; the root is its own parent
    mask = np.eye(N, dtype=bool)
    rows = node = np.arange(N)
    for _ in range(max_depth):
        node = up[node]  # every node's ancestor one level higher (the root stays the root)
        mask[rows, node] = True
    return torch.from_numpy(mask)


@lru_cache(maxsize=1024)
def graft_chain(paths: tuple[Path, ...], attach: int, length: int) -> Tree:
    """`build_tree(paths)` plus a chain of `length` lookup nodes whose first is `attach`'s first child.

    Args:
        paths: head rank paths, root excluded; the chain takes indices N .. N + length - 1 after them.
    """
    base = build_tree(paths)
    N = base.num_nodes
    if not 0 <= attach < N or length < 1:
        raise ValueError(f"graft needs 0 <= attach < {N} and length >= 1, got attach={attach}, length={length}")
    parent = base.parent + (attach,) + tuple(range(N, N + length - 1))
    depth = base.depth + tuple(base.depth[attach] + k for k in range(1, length + 1))
    rank = base.rank + (-1,) * length
    kids = [list(c) for c in base.children] + [[N + k + 1] for k in range(length - 1)] + [[]]
    kids[attach].insert(0, N)
    children = tuple(tuple(c) for c in kids)
    return Tree(base.paths, parent, depth, rank, children, base.topk, base.tree_indices, *_shape(parent),
                tuple(range(N, N + length)))


def merge_chain(tree: Tree, tokens: list[int], chain: list[int]) -> tuple[int, list[int]]:
    """Walk `chain` down the filled tree while its tokens match existing nodes, so siblings stay distinct.

    Returns:
        (the deepest matching node, the chain tokens left to graft below it).
    """
    node = 0
    for i, tok in enumerate(chain):
        nxt = next((c for c in tree.children[node] if tokens[c] == tok), None)
        if nxt is None:
            return node, chain[i:]
        node = nxt
    return node, []


def candidates(root_token: int, head_logits: torch.Tensor, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill the tree with tokens from each head's top-k.

    Args:
        root_token: the token the target chose; it sits at node 0.
        head_logits: [K, V] draft logits, K >= tree depth.
    Returns:
        tokens [N] long and draft probabilities q [N] float32 (1.0 at the root).
        q is for display only: a top-k candidate's draft law is a point mass.
    """
    D = len(tree.topk)
    assert head_logits.shape[0] >= D, f"tree depth {D} needs {D} heads, got {head_logits.shape[0]}"
    kmax = max(tree.topk)
    probs = torch.softmax(head_logits[:D].float(), dim=-1)  # [D, V]
    top_p, top_i = torch.topk(probs, kmax, dim=-1)  # [D, kmax]
    flat_tok = [torch.tensor([root_token], device=top_i.device)] + [top_i[d, :k] for d, k in enumerate(tree.topk)]
    flat_q = [torch.ones(1, device=top_p.device)] + [top_p[d, :k] for d, k in enumerate(tree.topk)]
    idx = tree.tree_indices.to(top_i.device)
    return torch.cat(flat_tok)[idx], torch.cat(flat_q)[idx]


# -- tree design --------------------------------------------------------------

def best_tree(acc: list[list[float]], budget: int) -> tuple[Path, ...]:
    """The rank paths (BFS order) with the highest expected accepted length within `budget` nodes.

    Args:
        acc: acc[d][r], the chance head d's rank-r guess is right given its path was; every factor is
            <= 1, so best-first (`best_first`) is optimal.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return tuple(sorted((path for _, path, _ in best_first(acc, [], budget)), key=lambda p: (len(p), p)))


def best_first(acc: list[list[float]], lookup: list[float], budget: int, min_value: float = 0.0
               ) -> Iterator[tuple[str, tuple, float]]:
    """Up to `budget` nodes, best first and lazily: ("heads", rank path, value) or ("lookup", (j,), value).

    Args:
        acc: acc[d][r], the chance head d's rank-r guess is right given its path was. A node's value is
            the product along its path, so every prefix of the order is the best tree of its size.
        lookup: lookup[j], the same for chain position j.
        min_value: nodes worth less are not yielded.
    """
    order = [sorted(range(len(row)), key=lambda r: -row[r]) for row in acc]  # ranks by estimate, per depth
    heap: list[tuple[float, int, str, tuple, int, float]] = []  # (-value, tiebreak, kind, path, sibling, parent value)
    tie = 0

    def push(kind: str, path: tuple, parent_value: float, factor: float, sib: int) -> None:
        nonlocal tie
        if parent_value * factor >= min_value:
            heapq.heappush(heap, (-parent_value * factor, tie, kind, path, sib, parent_value))
            tie += 1

    if acc:
        push("heads", (order[0][0],), 1.0, acc[0][order[0][0]], 0)
    if lookup:
        push("lookup", (0,), 1.0, lookup[0], 0)
    taken = 0
    while heap and taken < budget:
        neg, _, kind, path, sib, parent_value = heapq.heappop(heap)
        value = -neg
        taken += 1
        yield kind, path, value
        if kind == "lookup":
            j = path[0] + 1
            if j < len(lookup):
                push("lookup", (j,), value, lookup[j], 0)
            continue
        d = len(path) - 1
        if sib + 1 < len(order[d]):  # the next sibling: same parent, next-best rank
            r = order[d][sib + 1]
            push("heads", path[:-1] + (r,), parent_value, acc[d][r], sib + 1)
        if d + 1 < len(acc):  # the first child: the next head's best rank
            r = order[d + 1][0]
            push("heads", path + (r,), value, acc[d + 1][r], 0)


def expected_length(paths: tuple[Path, ...], acc: list[list[float]]) -> float:
    """Expected tokens per round (accepted drafts + the target's own token)."""
    total = 1.0
    for p in paths:
        prob = 1.0
        for d, r in enumerate(p):
            prob *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        total += prob
    return total


# A prior for unmeasured heads: head-d top-1 accuracy as Medusa reports for 7B chat models, less by rank.
_PRIOR_TOP1 = (0.60, 0.40, 0.28, 0.20)
_PRIOR = [[t * (0.45 ** r) / (1 + 0.2 * r) for r in range(10)] for t in _PRIOR_TOP1]

# Medusa's default tree for 5-head checkpoints (`mc_sim_7b_63` in FasterDecoding/Medusa), kept as data
# so published heads run with the tree they were tuned for.
MC_SIM_7B_63: tuple[Path, ...] = tuple(tuple(p) for p in (
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1],
    [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0],
    [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6],
    [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
    [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
    [1, 6], [0, 7, 0]))

PRESETS: dict[str, tuple[Path, ...]] = {
    "chain": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)),
    "small": best_tree(_PRIOR, 15),  # 16 nodes with the root
    "default": best_tree(_PRIOR, 63),  # 64 nodes with the root
    "mc_sim_7b_63": MC_SIM_7B_63,  # Medusa's tree for its 5-head checkpoints, 64 nodes with the root
}


def resolve_tree(tree: str | Tree | list | tuple, trained: tuple[Path, ...] | None = None, num_heads: int = 4) -> Tree:
    """A preset name, a list of paths, or a Tree -> Tree, checked against the heads."""
    if isinstance(tree, Tree):
        if tree.lookup:
            raise ValueError("tree: a Tree with grafted lookup nodes is per round; pass its head paths, "
                             "and use lookup=... for prompt lookup")
        out = tree
    elif isinstance(tree, str):
        if tree == "none":  # the root alone: prompt lookup drafts everything
            out = build_tree(())
        elif tree == "trained":
            if trained is None:
                raise ValueError("tree 'trained' needs heads that ship a tree.json; use one of " + ", ".join(PRESETS))
            out = build_tree(tuple(trained))
        elif tree == "chain":
            out = build_tree(tuple((0,) * d for d in range(1, num_heads + 1)))
        elif tree in PRESETS:
            out = build_tree(PRESETS[tree])
        else:
            raise ValueError(f"unknown tree preset {tree!r}; choose one of: trained, none, " + ", ".join(PRESETS))
    else:
        out = build_tree(tuple(tuple(p) for p in tree))
    if out.max_depth > num_heads:
        out = out.truncated(num_heads)
    return out
