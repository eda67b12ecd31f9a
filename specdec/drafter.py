"""The drafter interface: what a drafter gives a round, and what a round asks of it.

A drafter proposes a scored tree from a request's committed state: its nodes' tokens (root first, the
token the last round emitted), their parents (the tree), each node's draft probability q, and a source
name that events carry for its nodes. The round then verifies the tree, lossless for any proposal: the
verifier treats each node as a point-mass draft, so a proposal can change speed, never output.

`Proposal` is that value; `Drafter` is the protocol. Three drafters implement it: the Medusa heads on a
fixed tree (`drafting.HeadsDrafter`), EAGLE-3 (`eagle.Eagle3Drafter`) and prompt lookup
(`lookup.LookupDrafter`); `drafting.draft` merges a chain into the other's tree under the round's room.
The dynamic tree policy (`tree_policy.DynamicTree`) ranks the heads' candidates and the lookup chain
together instead of filling a fixed tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .draft_tree import Tree


@dataclass(frozen=True)
class Proposal:
    """A drafter's tree for one round."""

    tree: Tree  # shape: parents, depths, children in rank order
    tokens: list[int]  # [N] target ids, root first
    q: list[float | None]  # [N] the drafter's probability of each node given its parent (None at the root)
    source: str  # events name this drafter's nodes so
    match: int = 0  # prompt lookup: the length of the n-gram the chain follows (the likelier, the longer)


class Drafter(Protocol):
    """Proposes a tree per round from per-request state it keeps itself."""

    source: str

    def propose(self, state, root: int, room: int) -> Proposal | None:
        """This round's tree under `root`, at most `room` levels deep; None: nothing to draft.

        `state` is what the drafter reads of the request: EAGLE-3 its `EagleRun` (fed by the engine with the
        target's tapped states), prompt lookup the request's `NgramIndex`, the heads the request's run
        (the hidden state of its last committed token)."""
