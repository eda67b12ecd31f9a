"""Round events: what the engine reports, in plain Python values.

The UI, the benchmarks and the metrics consume these and never touch the
engine's tensors. One event per round; round 0 is the prefill.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

TOKEN_KINDS = ("accepted", "correction", "bonus", "baseline")


@dataclass(frozen=True)
class TreeNode:
    token_id: int
    text: str
    parent: int  # node index, -1 for the root
    depth: int  # 0 for the root
    rank: int  # top-k rank within its head; -1 for the root and for lookup nodes
    draft_prob: float | None  # q: the head's softmax probability (display only); None for root and lookup
    target_prob: float | None  # p(token) under the parent's filtered law; None if the parent was not reached
    status: str  # "root", "accepted", "rejected" or "not_reached"
    source: str = "heads"  # who drafted it: "root", "heads" or "lookup" (prompt lookup)


@dataclass(frozen=True)
class EmittedToken:
    token_id: int
    text: str  # incremental decode: may be "" while a multi-byte character is incomplete
    kind: str  # one of TOKEN_KINDS
    draft_prob: float | None
    target_prob: float | None


@dataclass(frozen=True)
class RoundEvent:
    index: int  # 0 = prefill
    nodes: tuple[TreeNode, ...]  # empty for the prefill and for plain decoding
    accepted_path: tuple[int, ...]  # node indices, root first
    emitted: tuple[EmittedToken, ...]
    params: dict  # the SamplingParams used in this round
    acceptance: str  # "greedy", "lossless", "typical" (lossy) or "plain"
    speculative: bool
    timings: dict  # ms: draft, forward, verify, cache, event, total
    total_tokens: int  # tokens emitted so far, this round included
    finished: str | None = None  # None, "eos", "length" or "context"
    prompt_tokens: int = 0
    prefix_cache_hit: int = 0  # prompt tokens reused from the prefix cache (round 0 only)
    # "seed" (round 0), "heads_ran" (1, or 1/K for a probe), "lookup_match" (a lookup chain's n-gram length)
    extra: dict = field(default_factory=dict)
    expected_length: float | None = None  # the dynamic tree's expected tokens this round (None: static)

    @property
    def accepted_length(self) -> int:
        """Tokens this round emitted per target forward (accepted drafts + the target's own)."""
        return len(self.emitted)

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.emitted)

    def to_dict(self) -> dict:
        return asdict(self)
