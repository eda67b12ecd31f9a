"""One request's decoding state, one round's draft, and the pure steps that turn a verdict into events.

The engine (and a batched round) carry a `RunState` per request from round to round; each round's
`Draft` holds the tree it verifies. `cut`, `with_text` and `tree_nodes` are pure functions of
those values: where the emitted tokens stop, their incremental text, and the tree as event nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from .detok import IncrementalDecoder
from .draft_tree import Tree
from .eagle import EagleRun
from .events import EmittedToken, TreeNode
from .lookup import NgramIndex
from .request import Plan
from .tree_policy import DynamicTree
from .verifier import Verdict


@dataclass(frozen=True)
class Draft:
    """One round's draft: the tree, its N tokens (root first) and their draft probabilities q."""

    tree: Tree
    tokens: list[int]  # [N]
    q: list[float | None]  # [N]; None for the root and for prompt-lookup nodes (point-mass drafts)
    drafted: bool  # False for a plain round: the root alone, nothing proposed
    # Per node, the dynamic policy's `drafting.HeadNode` or `ChainNode` (None: root); empty for static trees.
    learn: tuple = ()
    expected: float | None = None  # the policy's expected tokens this round
    heads_ran: float = 0.0  # the share of the heads that ran: 0, 1/K for a probe of the first, or 1
    match: int = 0  # the length of the n-gram the lookup chain followed (0: no chain)
    # Greedy dynamic rounds with heads: every candidate's (scores [D][k], ids [D][k]), for `drafting.learn`.
    candidates: tuple | None = None
    source: str = "heads"  # what drafted the non-lookup nodes: "heads" (Medusa) or "eagle3"


@dataclass
class RunState:
    """One request's decoding state, carried from round to round."""

    plan: Plan
    cache: object  # kv_cache.SlotCache, or a DynamicCache where the model needs it
    hit: int  # prompt tokens reused from the prefix cache
    seed: int
    uniforms: list[float]  # one per output position: the token at position t is drawn with uniforms[t]
    detok: IncrementalDecoder
    ngram: NgramIndex | None
    limit: int  # the model's context length
    committed: int = 0  # tokens in the KV buffer; the pending token is fed next round
    pending: int = -1
    h_last: torch.Tensor | None = None  # [H] hidden state of the last committed token
    produced: int = 0
    finished: str | None = None
    policy: DynamicTree | None = None  # the "auto" tree policy's per-request state
    shared_heads: Callable[["RunState"], torch.Tensor] | None = None  # a batched round's heads, for all members at once
    eagle: "EagleRun | None" = None  # the EAGLE-3 drafter's state, when it drafts this request


def cut(tokens: tuple[EmittedToken, ...], produced: int, plan: Plan, committed: int, limit: int
        ) -> tuple[tuple[EmittedToken, ...], str | None]:
    """The round's tokens up to the first EOS and within max_new_tokens, and why decoding finished."""
    finished = None
    for i, t in enumerate(tokens):
        if t.token_id in plan.eos:
            tokens, finished = tokens[: i + 1], "eos"
            break
    room = plan.request.max_new_tokens - produced
    if len(tokens) >= room:
        tokens, finished = tokens[:room], finished or "length"
    # The pending token still has to be fed at position `committed` next round.
    if finished is None and committed >= limit:
        finished = "context"
    return tokens, finished


def with_text(tokens: tuple[EmittedToken, ...], detok: IncrementalDecoder, finished: str | None
              ) -> tuple[EmittedToken, ...]:
    """Give the already cut tokens their incremental text, flushing the decoder on the last round."""
    out = [replace(t, text=detok.push(t.token_id)) for t in tokens]
    if finished is not None and out:
        tail = detok.flush()
        if tail:
            out[-1] = replace(out[-1], text=out[-1].text + tail)
    return tuple(out)


def tree_nodes(tree: Tree, toks: list[int], q: list[float | None], verdict: Verdict,
               token_text: Callable[[int], str], source: str = "heads") -> tuple[TreeNode, ...]:
    """The round's tree as plain event nodes: token, text, shape, q, p and what verification made of it."""
    on_path = set(verdict.accepted)
    rejected = set(verdict.rejected)
    looked_up = set(tree.lookup)
    out = []
    for i in range(tree.num_nodes):
        if i == 0:
            status = "root"
        elif i in on_path:
            status = "accepted"
        elif i in rejected:
            status = "rejected"
        else:
            status = "not_reached"
        out.append(TreeNode(toks[i], token_text(toks[i]), tree.parent[i], tree.depth[i], tree.rank[i], q[i],
                            verdict.target_prob.get(i), status, "root" if i == 0 else "lookup" if i in looked_up
                            else source))
    return tuple(out)
