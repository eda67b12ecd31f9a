"""Verification: which branch of the draft tree does the target accept?

p = target, q = draft (Leviathan et al. 2023, Alg. 1). Drafts are top-k tokens chosen deterministically,
so q is a point mass on each candidate and never enters the acceptance test (dividing by it is a bug).

Glossary (as in vLLM's rejection sampler):
- accepted token: a draft node the target agreed with;
- correction token: the target's own token at the last accepted node when it is none of its children
  (in law, a draw from the residual r);
- bonus token: drawn from p at an accepted leaf (no children to try).

Rules:
- greedy: follow the child whose token is the target's argmax.
- lossless (the default when temperature > 0): at each node draw the target's token y from the filtered
  p by inverse CDF at the uniform of y's output position; accept the child whose token is y, else y is
  the correction (at a leaf, the bonus). With point-mass drafts this is SpecInfer's rule (try children in
  order, accept x with r(x), r starting as p; on a rejection zero r(x) and renormalise; all rejected:
  sample r) in one draw per depth instead of one per child: the same joint law of (accepted child,
  emitted token), the emitted token distributed as p. Uniforms fixed per position
  (`sampler.position_uniforms`) make a seeded request's text the same whatever tree, policy or batch.
- typical (Medusa, **lossy**): accept x if p(x) > min(eps, delta * exp(-H(p))); output no longer follows p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .draft_tree import Tree
from .sampler import SamplingParams, draw, target_probs

ACCEPTANCE_RULES = ("greedy", "lossless", "typical")
LOSSY_RULES = frozenset({"typical"})


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]  # node indices of the accepted path, root (0) first
    next_token: int  # the target's own token after the path
    next_kind: str  # "correction" or "bonus"
    next_prob: float  # p(next_token) at the last accepted node
    target_prob: dict[int, float]  # node -> p(token) under its parent's law, for visited parents
    rejected: tuple[int, ...]  # children tried and rejected


# Above this a CPU computes rows on demand, as one product over every node's row costs real compute there.
BATCHED_VERIFY_MAX_CPU = 32  # nodes


def all_rows_at_once(num_nodes: int, device: torch.device) -> bool:
    """Does greedy verification of a tree of `num_nodes` take every row's logits in one product here?"""
    return num_nodes <= BATCHED_VERIFY_MAX_CPU or device.type != "cpu"


def verify_greedy(tokens: list[int], tree: Tree, logits: torch.Tensor) -> Verdict:
    """`verify(..., rule="greedy")` from every node's logits at once, in two host syncs.

    Args:
        tokens: N token ids, tokens[0] is the root.
        logits: [N, V] target logits, row i after node i's path.
    """
    if tree.num_nodes == 1:  # a plain round, the commonest: its argmax and log-probability in one host sync
        row = logits[0].float()
        best = row.argmax()
        host = torch.stack([best.float(), row[best] - torch.logsumexp(row, -1)]).tolist()  # ids < 2**24: exact
        return Verdict((0,), int(host[0]), "bonus", math.exp(host[1]), {}, ())
    return verify_greedy_batch([(tokens, tree)], logits)[0]


def verify_greedy_batch(trees: list[tuple[list[int], Tree]], logits: torch.Tensor) -> list[Verdict]:
    """`verify_greedy` for several requests at once (a batched round), in two host syncs in all.

    Args:
        trees: each request's (N_i token ids, tree); tokens[0] is its root.
        logits: [sum N_i, V] target logits, the requests' rows one after another in `trees` order.
    """
    assert logits.shape[0] == sum(tree.num_nodes for _, tree in trees)
    best = logits.argmax(dim=-1).tolist()  # [sum N_i]
    walks, lse_rows, rows, cols, lse_at = [], [], [], [], []
    off = 0
    for tokens, tree in trees:
        accepted, rejected, node = [0], [], 0
        while True:  # from the root, the child whose token is the target's argmax
            kids = tree.children[node]
            chosen = next((c for c in kids if tokens[c] == best[off + node]), None)
            rejected.extend(c for c in kids if c != chosen)
            if chosen is None:
                break
            accepted.append(chosen)
            node = chosen
        # p(token | parent) for every child of a visited node, then p(next token): gathered below.
        kids = [c for v in accepted for c in tree.children[v]]
        where = {v: len(lse_rows) + k for k, v in enumerate(accepted)}
        lse_rows += [off + v for v in accepted]
        parents = [tree.parent[c] for c in kids] + [node]
        rows += [off + r for r in parents]
        cols += [tokens[c] for c in kids] + [best[off + node]]
        lse_at += [where[r] for r in parents]
        walks.append((accepted, rejected, best[off + node], bool(tree.children[node]), kids))
        off += tree.num_nodes
    # Every index in one host tensor and one copy: four blocking copies would each wait for the device.
    idx = torch.tensor(lse_rows + rows + cols + lse_at)
    if logits.device.type == "cuda":
        idx = idx.pin_memory().to(logits.device, non_blocking=True)
    a, r = len(lse_rows), len(rows)
    lse = torch.logsumexp(logits[idx[:a]].float(), dim=-1)  # [sum A_i]
    picked = logits[idx[a : a + r], idx[a + r : a + 2 * r]].float()  # [R]
    probs = (picked - lse[idx[a + 2 * r :]]).exp().tolist()
    out, at = [], 0
    for accepted, rejected, next_token, inner, kids in walks:
        mine, at = probs[at : at + len(kids) + 1], at + len(kids) + 1
        out.append(Verdict(tuple(accepted), next_token, "correction" if inner else "bonus", mine[-1],
                           dict(zip(kids, mine)), tuple(rejected)))
    return out


def verify(tokens: list[int], tree: Tree, logits_at: Callable[[int], torch.Tensor], params: SamplingParams,
           rule: str, uniforms: Sequence[float],
           typical_eps: float = 0.09, typical_delta: float = 0.3) -> Verdict:
    """Walk the tree from the root and return the accepted path.

    Args:
        tokens: N token ids, tokens[0] is the root (already committed).
        tree: the tree the tokens fill.
        logits_at: node index -> [V] target logits after that node's path; called only on the accepted path.
        params: sampler settings shaping p (the same filters as plain sampling).
        rule: "greedy", "lossless" or "typical" (lossy).
        uniforms: the only randomness: uniforms[d] in [0, 1) draws the token at depth d (the request's
            `sampler.position_uniforms` from the root's position on; greedy reads none).
    """
    if rule not in ACCEPTANCE_RULES:
        raise ValueError(f"acceptance rule must be one of {ACCEPTANCE_RULES}, got {rule!r}")
    if params.greedy and rule != "greedy":
        rule = "greedy"  # temperature 0: every rule reduces to the argmax
    accepted = [0]
    target_prob: dict[int, float] = {}
    rejected: list[int] = []
    node = 0
    while True:
        row = logits_at(node)  # [V]
        kids = tree.children[node]
        if rule == "greedy":
            tok = int(row.argmax().item())
            p = torch.softmax(row.float(), -1)  # [V], for the probabilities shown in events only
            if kids:  # one gather and one sync for every child, not one per child
                for c, pc in zip(kids, p[[tokens[c] for c in kids]].tolist()):
                    target_prob[c] = pc
            chosen = next((c for c in kids if tokens[c] == tok), None)
            rejected.extend(c for c in kids if c != chosen)  # compared with the argmax and lost
            if chosen is None:
                return Verdict(tuple(accepted), tok, "correction" if kids else "bonus", float(p[tok]), target_prob,
                               tuple(rejected))
        elif rule == "typical":
            p = target_probs(row, params)  # [V] float32, the filtered target law
            chosen = None
            entropy = -(p * torch.log(p.clamp_min(1e-30))).sum().item()
            threshold = min(typical_eps, typical_delta * math.exp(-entropy))
            for c in kids:
                target_prob[c] = float(p[tokens[c]])
                if target_prob[c] > threshold:
                    chosen = c
                    break
                rejected.append(c)
            if chosen is None:
                tok, _, pt = draw(p, uniforms[len(accepted) - 1])
                return Verdict(tuple(accepted), tok, "correction" if kids else "bonus", pt, target_prob,
                               tuple(rejected))
        else:
            p = target_probs(row, params)  # [V] float32, the filtered target law
            # The target's token here, and p at it and at every child, in one host sync.
            tok, px, pt = draw(p, uniforms[len(accepted) - 1], [tokens[c] for c in kids])
            target_prob.update(zip(kids, px))
            chosen = next((c for c in kids if tokens[c] == tok), None)
            rejected.extend(c for c in kids if c != chosen)  # compared with the target's token and lost
            if chosen is None:
                return Verdict(tuple(accepted), tok, "correction" if kids else "bonus", pt, target_prob,
                               tuple(rejected))
        accepted.append(chosen)
        node = chosen

