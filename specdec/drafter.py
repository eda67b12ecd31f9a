"""The drafter interface: what a drafter gives a round, and what a round asks of it.

A drafter proposes a scored tree from a request's committed state: its nodes' tokens (root first, the
token the last round emitted), their parents (the tree), each node's draft probability q, and a source
name that events carry for its nodes. The round then verifies the tree, lossless for any proposal: the
verifier treats each node as a point-mass draft, so a proposal can change speed, never output.

`Proposal` is that value; `Drafter` is the protocol. The EAGLE-3 drafter (`eagle.Eagle3Drafter`)
implements it; Medusa heads and prompt lookup still draft inside the engine's draft step, and the tree
policy that merges several proposals under one budget reads their candidates directly.
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


class Drafter(Protocol):
    """Proposes a tree per round from per-request state it keeps itself."""

    source: str

    def start(self) -> object:
        """A new request's state (fed by the engine with what the target computed, where the drafter reads it)."""

    def propose(self, state, root: int, room: int) -> Proposal | None:
        """This round's tree under `root`, at most `room` levels deep; None: nothing to draft."""
