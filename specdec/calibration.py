"""Calibrated acceptance estimates: how often verification agreed with a draft score, per row and score bin.

The dynamic tree (`tree_policy`) reads a drafted node's chance of being accepted as its draft score q
times a ratio learned from earlier verdicts: for greedy rounds, whether the node was the target's argmax;
for sampled ones, the target's filtered p of its token (the chance the lossless rule accepts it).
"""
from __future__ import annotations

import bisect

BIN_EDGES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8)  # lower edges of q bins: few, so each fills within a request
PRIOR_WEIGHT = 1.0  # pseudo-observations behind the prior: a few rounds override it
DECAY = 0.97  # per round: about 30 rounds of memory, so a slider change is learned quickly

# The prior's pseudo-observations, in each bin's own scale of q (its middle).
_PRIOR_W = tuple(PRIOR_WEIGHT * (lo + hi) / 2 for lo, hi in zip(BIN_EDGES, BIN_EDGES[1:] + (1.0,)))


class Calibrator:
    """Acceptance estimates min(1, q * ratio) per row (head depth and rank, or chain position) and q bin.

    Args:
        prior: each row's ratio before evidence (the last repeats), weighing PRIOR_WEIGHT at mid-bin q.
        stride: a row's prior is the current ratio of the row `stride` above it (the same rank one head
            up), so the first head's lessons carry deeper; 0: every row keeps its fixed prior.
    """

    def __init__(self, rows: int, prior: float | tuple[float, ...] = 1.0, stride: int = 0) -> None:
        prior = prior if isinstance(prior, tuple) else (prior,)
        self.prior = [prior[min(d, len(prior) - 1)] for d in range(rows)]  # [R]
        self.stride = stride  # 0: every row has its fixed prior
        # Sums are held divided by `_scale`, the decay since the last rescale: a round decays in one multiply.
        self._outcome = [[0.0] * len(BIN_EDGES) for _ in range(rows)]  # [R, bins]
        self._score = [[0.0] * len(BIN_EDGES) for _ in range(rows)]  # [R, bins]
        self._scale = 1.0
        self._ratios: list[list[float]] | None = None  # [R, bins], rebuilt after each observe

    @property
    def outcome(self) -> list[list[float]]:
        """Decayed sums of outcomes, per row and bin."""
        return [[x * self._scale for x in r] for r in self._outcome]

    @property
    def score(self) -> list[list[float]]:
        """Decayed sums of scores, per row and bin."""
        return [[x * self._scale for x in r] for r in self._score]

    @property
    def rows(self) -> int:
        return len(self.prior)

    def ratios(self) -> list[list[float]]:
        if self._ratios is None:
            out: list[list[float]] = []
            s, bins = self._scale, len(BIN_EDGES)
            for i, (got, scored) in enumerate(zip(self._outcome, self._score)):
                prior = out[i - self.stride] if self.stride and i >= self.stride else [self.prior[i]] * bins
                out.append([(o * s + w * p) / (sc * s + w) for o, sc, p, w in zip(got, scored, prior, _PRIOR_W)])
            self._ratios = out
        return self._ratios

    def estimate(self, row: int, q: float) -> float:
        b = bisect.bisect_right(BIN_EDGES, q) - 1
        if self.stride or self._ratios is not None:
            return min(1.0, q * self.ratios()[row][b])
        # A row with its own fixed prior needs one cell, not the table (lookup chains: one bin, q = 1)
        o, sc, p, w, s = self._outcome[row][b], self._score[row][b], self.prior[row], _PRIOR_W[b], self._scale
        return min(1.0, q * ((o * s + w * p) / (sc * s + w)))

    def observe(self, seen: list[tuple[int, float, float]]) -> None:
        """One round's (row, score q, outcome) triples; decays the old evidence first."""
        self._scale *= DECAY
        if self._scale < 1e-30:  # fold the decay into the sums long before the division could overflow
            self._outcome, self._score, self._scale = self.outcome, self.score, 1.0
        inv = 1.0 / self._scale
        for d, q, outcome in seen:
            b = bisect.bisect_right(BIN_EDGES, q) - 1
            self._outcome[d][b] += outcome * inv
            self._score[d][b] += q * inv
        self._ratios = None
