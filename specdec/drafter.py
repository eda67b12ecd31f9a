"""The drafter interface: a drafter proposes a scored tree (`Proposal`) from a request's committed state.

The verifier treats each node as a point-mass draft, so a proposal can change speed, never output.
Implemented by `drafting.HeadsDrafter` (Medusa), `eagle.Eagle3Drafter` and `lookup.LookupDrafter`.
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

        Args:
            state: what the drafter reads of the request: EAGLE-3 its `EagleRun`, prompt lookup its
                `NgramIndex`, the heads its `RunState` (the last committed token's hidden state).
        """
