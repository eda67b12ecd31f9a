"""The draft step: which drafters propose a round's tree, and how their proposals merge under one budget.

A static preset lets the request's drafter (Medusa heads or EAGLE-3) propose and merges the lookup chain
into its tree (`lookup_mode="merge"`) or lets a chain draft alone ("first"); "auto"
(`tree_policy.DynamicTree`) ranks head candidates and the chain together. Every choice is a function of
committed tokens and the round's params, so output stays exact whatever is drafted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from .draft_tree import Tree, build_tree, candidates, graft_chain, merge_chain
from .drafter import Proposal
from .lookup import LOOKUP
from .request import ROOT_ONLY
from .run_state import Draft, RunState
from .sampler import SamplingParams
from .tree_policy import head_scores
from .verifier import Verdict

if TYPE_CHECKING:
    from .engine import Engine


class HeadNode(NamedTuple):
    """A drafted node the heads proposed: head `depth`'s rank-`rank` candidate, scored `score`."""

    depth: int
    rank: int
    score: float


class ChainNode(NamedTuple):
    """A drafted node from the lookup chain, at chain `position`."""

    position: int


def draft(engine: "Engine", run: "RunState", params: SamplingParams) -> "Draft":
    """Step 1: the round's tree and tokens from the request's drafter, prompt lookup, or the root alone."""
    plan, req = run.plan, run.plan.request
    # The root (pending) goes at position `committed`; a depth-d node at committed + d.
    room = min(req.max_new_tokens - run.produced - 1, run.limit - 1 - run.committed)
    if plan.tree is None or room < 1:  # plain decoding, or the last token: nothing to draft
        return Draft(ROOT_ONLY, [run.pending], [None], drafted=False,
                     expected=1.0 if run.policy is not None else None)
    chain = LOOKUP.propose(run.ngram, run.pending, min(req.lookup, room)) if run.ngram is not None else None
    if run.policy is not None:
        return _dynamic(engine, run, params, chain, room)
    drafter, state = (engine.eagle_drafter, run.eagle) if run.eagle is not None else (engine.heads_drafter, run)
    main = None
    if drafter is not None and (chain is None or req.lookup_mode != "first"):  # "first": a chain drafts alone
        main = drafter.propose(state, run.pending, room)
    tree, tokens, q = merged(run.pending, main, chain)
    if tree.num_nodes == 1:
        return Draft(tree, tokens, q, drafted=False)
    return Draft(tree, tokens, q, drafted=True, heads_ran=1.0 if main is not None and main.source == "heads" else 0.0,
                 match=chain.match if chain is not None else 0, source=drafter.source if drafter else "heads")


def merged(root: int, main: Proposal | None, chain: Proposal | None
           ) -> tuple[Tree, list[int], list[float | None]]:
    """Merge a lookup chain into a drafter's tree under `root` (either alone: itself; neither: the root)."""
    if main is None:
        main, chain = chain, None
    if main is None:
        return ROOT_ONLY, [root], [None]
    tree, tokens, q = main.tree, list(main.tokens), list(main.q)
    if chain is not None:
        tree, tokens = graft(tree, tokens, chain.tokens[1:])
        q += [None] * (len(tokens) - len(q))
    return tree, tokens, q


class HeadsDrafter:
    """The Medusa heads behind `drafter.Drafter`, filling the request's static tree (`candidates`)."""

    source = "heads"

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine

    def propose(self, state: "RunState", root: int, room: int) -> Proposal | None:
        tree = state.plan.tree if state.plan.tree.max_depth <= room else state.plan.tree.truncated(room)
        if tree.num_nodes == 1:
            return None
        with torch.inference_mode():
            tokens, q = candidates(root, _heads_logits(self.engine, state), tree)  # [N], [N]
        q_list = q.tolist()
        q_list[0] = None
        return Proposal(tree, tokens.tolist(), q_list, self.source)


def _dynamic(engine: "Engine", run: "RunState", params: SamplingParams, proposal: Proposal | None, room: int
             ) -> "Draft":
    """Step 1 under "auto": the policy picks the tree from the heads' scores and the lookup `proposal`."""
    policy, scores, top = run.policy, None, None
    chain, match = (proposal.tokens[1:], proposal.match) if proposal is not None else ([], 0)
    k = policy.wants_heads(len(chain), room, params.greedy, match) if engine.heads is not None else 0
    if k:
        with torch.inference_mode():
            # Scored under the round's own filters: that is the law the target is verified with.
            top_q, top_i, score = head_scores(_heads_logits(engine, run, min(k, room)), params)  # [D, k] each
            host = torch.stack([top_q, score, top_i.float()]).tolist()  # one host sync; ids < 2**24 are exact
        top, scores = (host[0], host[2]), host[1]  # ids as floats: int() only for the nodes drafted
    if scores is None and not chain:  # the heads rest and nothing repeats: a plain round
        return Draft(ROOT_ONLY, [run.pending], [None], drafted=False, expected=1.0)
    choice = policy.choose(scores, len(chain), room, params.greedy, match)
    tree = build_tree(choice.paths, checked=True)  # prefix-closed and sorted by construction
    tokens, q, learn = [run.pending], [None], [None]
    for p in tree.paths[1:]:  # BFS order: node i is paths[i]
        d, r = len(p) - 1, p[-1]
        tokens.append(int(top[1][d][r]))
        q.append(top[0][d][r])
        learn.append(HeadNode(d, r, scores[d][r]))
    chain = chain[: choice.chain]
    if chain:
        tree, tokens = graft(tree, tokens, chain)
        grafted = len(tokens) - len(q)
        q += [None] * grafted
        first = len(chain) - grafted  # chain positions the merged head nodes stood in for
        learn += [ChainNode(first + j) for j in range(grafted)]
    return Draft(tree, tokens, q, drafted=True, learn=tuple(learn), expected=choice.expected,
                 heads_ran=k / engine.heads.config.num_heads if k else 0.0, match=match if chain else 0,
                 candidates=(scores, top[1]) if scores is not None and params.greedy else None)


def _heads_logits(engine: "Engine", run: "RunState", k: int | None = None) -> torch.Tensor:
    """The first k heads' logits [k, V] (None: all) after the last committed token, batched when shared."""
    if run.shared_heads is not None:
        return run.shared_heads(run)[:k]
    return engine.head_logits(run.h_last, k)


def graft(tree: Tree, tokens: list[int], chain: list[int]) -> tuple[Tree, list[int]]:
    """Merge a lookup chain into the filled tree and graft the rest, no deeper than the chain is long."""
    attach, rest = merge_chain(tree, tokens, chain)
    if not rest:
        return tree, tokens
    return graft_chain(tree.paths[1:], attach, len(rest)), tokens + rest


def learn(run: "RunState", draft: "Draft | None", verdict: Verdict, params: SamplingParams) -> None:
    """The dynamic policy learns from the verdict: each drafted node whose parent was reached."""
    if run.policy is None or draft is None or not draft.drafted:
        return
    reached = set(verdict.accepted)
    heads, lookup = [], []
    for c in range(1, draft.tree.num_nodes):
        if draft.tree.parent[c] not in reached:
            continue
        outcome = (1.0 if c in reached else 0.0) if params.greedy else verdict.target_prob.get(c)
        if outcome is None:  # sampling stopped trying siblings after an earlier one was accepted
            continue
        node = draft.learn[c]
        if isinstance(node, HeadNode):
            heads.append((node.depth, node.rank, node.score, outcome))
        else:
            lookup.append((node.position, outcome))
    if draft.candidates is not None:  # else a low-scored sibling, never drafted, would keep its prior
        heads += _undrafted(draft, verdict, {(d, r) for d, r, _, _ in heads})
    run.policy.observe(params.greedy, heads, lookup, draft.tree.num_nodes, len(verdict.accepted), draft.heads_ran,
                       draft.match)


def _undrafted(draft: "Draft", verdict: Verdict, seen: set[tuple[int, int]]) -> list[tuple[int, int, float, float]]:
    """(depth, rank, score, outcome) of undrafted greedy head candidates at depths the accepted path reached.

    Args:
        seen: the (depth, rank) pairs already learned as drafted nodes.
    """
    scores, ids = draft.candidates  # [D][k] each
    path = verdict.accepted
    truth = [draft.tokens[n] for n in path[1:]] + [verdict.next_token]  # the target's token at depth 1, 2, ...
    out = []
    for d in range(min(len(ids), len(path))):
        for r, (score, token) in enumerate(zip(scores[d], ids[d])):
            if (d, r) not in seen:
                out.append((d, r, score, 1.0 if int(token) == truth[d] else 0.0))
    return out


class SharedHeads:
    """Every member's head logits in one [b, H] -> [K, b, V] call, made when the first member asks."""

    def __init__(self, heads, members: list) -> None:
        self.heads = heads
        self.row = {id(m.run): i for i, m in enumerate(members)}
        self.members = members
        self.rows: torch.Tensor | None = None  # [K, b, V]
        self.per_member = len(members) == 1

    def __call__(self, run: RunState) -> torch.Tensor:
        if not self.per_member and self.rows is None:
            h = torch.stack([m.run.h_last for m in self.members])  # [b, H]
            try:
                rows = self.heads(h)
            except (RuntimeError, ValueError, IndexError, TypeError):
                rows = None  # heads that take one hidden state only (a test double) run per member
            if rows is None or rows.dim() != 3 or rows.shape[1] != len(self.members):
                self.per_member = True
            else:
                self.rows = rows
        if self.per_member:
            return self.heads(run.h_last)  # [K, V]
        return self.rows[:, self.row[id(run)]]  # [K, V]
