"""The dynamic draft tree ("auto"): each round, the tree worth most accepted tokens per second.

EAGLE-2 (Li et al., 2024) from Medusa heads: candidates scored by calibrated acceptance estimates are
taken best-first with the lookup chain and cut where `CostModel` tokens per second peak; heads that lose
rest. Every choice depends only on committed tokens, the round's params and earlier verdicts, never on
the round's own draws, so output is exactly plain decoding's for any tree.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator

import torch

from .calibration import BIN_EDGES, Calibrator
from .cost import CostModel
from .draft_tree import best_first
from .sampler import SamplingParams, target_probs

TOPK = 10  # candidates per head considered each round
# Acceptance-to-score ratio before any evidence: distilled heads are overconfident about sampled tokens.
PRIOR = {"greedy": 1.0, "sampled": 0.6}
# A lookup token's prior acceptance per match length (1, 2, 3+) and chain position (first, later): longer
# matches, and tokens after an accepted one, are likelier.
MATCH_CLASSES = 3  # chains are calibrated apart after a 1-gram, a 2-gram and a longer match
LOOKUP_PRIOR = {"greedy": ((0.4, 0.8), (0.7, 0.9), (0.9, 0.95)), "sampled": ((0.2, 0.5), (0.35, 0.6), (0.6, 0.7))}
# How fast the heads' running rate follows new rounds, and the full rounds before it is first judged:
# greedy slowly after a trial, as a bad greedy stretch says little; sampled fast, as losing rounds cost.
RATE_WEIGHT = {"greedy": 0.1, "sampled": 0.3}
TRIAL = {"greedy": 4, "sampled": 1}
# Rest the heads below this share of plain's rate; greedy's margin absorbs noise in the load-time cost model.
REST_BELOW = {"greedy": 0.8, "sampled": 1.0}
GAIN_WEIGHT = 0.3  # how fast the running average of what the heads' nodes added to a tree follows new rounds
RANKS = 3  # calibration rows per head: rank 0, rank 1, ranks 2+ (a head's first guess is special)
MIN_VALUE = 1e-4  # nodes less likely than this are never worth a slot
# Rests of 4, 16, 64 rounds, as heads cost more than their forward (on a CPU they evict the target's weights).
MAX_BACKOFF = 64  # rounds the heads rest at most before they are tried again
FIRST_REST = 4
STRONG = 1.5  # a single full round this much faster than plain brings the heads straight back


def head_scores(logits: torch.Tensor, params: SamplingParams, k: int = TOPK
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each head's top-k candidates, their softmax q (shown in the UI) and their score.

    Args:
        logits: [D, V] head logits.
    Returns:
        q [D, k] float32, token ids [D, k] long, and score [D, k] float32: the candidate's probability
        under the round's filters (the law the target is verified with), or q when greedy.
    """
    x = logits.float()
    q, ids = torch.softmax(x, -1).topk(min(k, x.shape[-1]), dim=-1)  # [D, k] each
    if params.greedy:
        return q, ids, q
    return q, ids, target_probs(x, params).gather(-1, ids)


@dataclass(frozen=True)
class Choice:
    """One round's dynamic tree: head rank paths, how much of the lookup chain, and its worth."""

    paths: tuple[tuple[int, ...], ...]  # head nodes as rank paths (root excluded), BFS order
    chain: int  # lookup chain tokens to graft (0: none)
    expected: float  # expected tokens this round: accepted drafts + the target's own token


class DynamicTree:
    """One request's tree policy: calibration and the heads' rest schedule, learned from its own verdicts."""

    def __init__(self, num_heads: int, cost: CostModel, max_nodes: int | None = None, lookup: int = 0) -> None:
        self.cost = cost
        self.max_nodes = min(max_nodes or cost.max_nodes, cost.max_nodes)
        # T(n) per tree size without the heads (spent either way once they ran): a list lookup per node.
        self._round_s = [cost.round_time(n, False) for n in range(1, self.max_nodes + 1)]  # [max_nodes]
        self._floor_s = [min(self._round_s[i:]) for i in range(self.max_nodes)]  # the least any size >= n costs
        self.heads_cal = {m: Calibrator(num_heads * RANKS, PRIOR[m], stride=RANKS) for m in ("greedy", "sampled")}
        # Lookup rows: per match class, one per chain position (the first two have their own prior).
        self._chain_rows = max(lookup, 1)
        self.lookup_cal = {m: Calibrator(MATCH_CLASSES * self._chain_rows, tuple(
            prior[min(j, len(prior) - 1)] for prior in LOOKUP_PRIOR[m] for j in range(self._chain_rows)))
            for m in ("greedy", "sampled")}
        self.num_heads = num_heads
        self.lookup = lookup
        self.rest = 0  # rounds left before the heads run again
        # Whether the next heads round probes with the first head alone: after a rest, and first in a
        # sampled request (greedy opens with every head, where distilled heads usually pay).
        self.probe: bool | None = None
        self.probe_wins = 0  # probes in a row that beat plain decoding
        self.backoff = FIRST_REST
        self.heads_rate: float | None = None  # running tokens/s that rounds with every head actually yielded
        self._trial: list[float] = []  # the first full rounds' rates, before heads_rate exists
        # What the heads' own nodes added to recent trees (running averages): expected tokens and nodes.
        self.heads_gain, self.heads_nodes = 0.0, 0.0
        self._chain_alone: tuple | None = None  # this round's lookup-only choice, from `wants_heads` for `choose`

    @staticmethod
    def mode(greedy: bool) -> str:
        return "greedy" if greedy else "sampled"

    def wants_heads(self, chain: int, room: int, greedy: bool, match: int = 1) -> int:
        """How many heads run: 0 while they rest or when the chain alone is faster, 1 to probe, else all."""
        self._chain_alone = None
        if self.rest > 0:
            self.rest -= 1
            return 0
        if chain and self.heads_rate is not None:
            n, rate, picks = self._best_prefix(
                best_first([], self._lookup_estimates(chain, room, self.mode(greedy), match), self.max_nodes - 1,
                           MIN_VALUE),
                greedy)
            # What `choose` computes this round if the heads do not run: kept, not computed twice
            self._chain_alone = ((chain, room, greedy, match), (n, rate, picks))
            # The heads add only where the chain's first token is rejected: otherwise they are its siblings.
            first = picks[0][2] if n else 0.0
            expected = 1.0 + sum(v for _, _, v in picks[:n]) + (1.0 - first) * self.heads_gain
            nodes = 1 + n + round(self.heads_nodes)
            if expected / self.cost.round_time(nodes, True, expected, not greedy) <= rate:
                return 0
        if self.probe is None:
            self.probe = not greedy
        if self.probe:
            self.probe = False
            return 1
        return self.num_heads

    def choose(self, q: list[list[float]] | None, chain: int, room: int, greedy: bool, match: int = 1) -> Choice:
        """The round's tree from the heads' scores and the lookup chain's length.

        Args:
            q: [D][TOPK] score of head d's rank-r candidate (None when the heads did not run).
            chain: lookup chain tokens proposed this round (0: none).
            room: the deepest a node may be (token and context limits).
            greedy: the round's params decode greedily.
            match: the length of the n-gram the chain follows (`lookup.NgramIndex.match`).
        """
        mode = self.mode(greedy)
        heads_ran = q is not None
        known, self._chain_alone = self._chain_alone, None
        if not heads_ran and known is not None and known[0] == (chain, room, greedy, match):
            best, _, picks = known[1]  # the lookup chain alone, as `wants_heads` just valued it
        else:
            acc = self._head_estimates(q, room, mode)
            best, _, picks = self._best_prefix(
                best_first(acc, self._lookup_estimates(chain, room, mode, match), self.max_nodes - 1, MIN_VALUE),
                greedy)
        if heads_ran and picks:
            # Once the heads ran, draft at least their best node, or a cold estimate could never warm up.
            best = max(best, 1)
        taken = picks[:best]
        if heads_ran:
            gain = sum(v for kind, _, v in taken if kind == "heads")
            nodes = sum(1 for kind, _, _ in taken if kind == "heads")
            self.heads_gain += GAIN_WEIGHT * (gain - self.heads_gain)
            self.heads_nodes += GAIN_WEIGHT * (nodes - self.heads_nodes)
        paths = tuple(sorted((p for kind, p, _ in taken if kind == "heads"), key=lambda p: (len(p), p)))
        n_chain = sum(1 for kind, _, _ in taken if kind == "lookup")
        expected = 1.0 + sum(v for _, _, v in taken)
        return Choice(paths, n_chain, expected)

    def observe(self, greedy: bool, heads: list[tuple[int, int, float, float]], lookup: list[tuple[int, float]],
                nodes: int, accepted: int, heads_ran: float, match: int = 1) -> None:
        """Learn from one round's verdict.

        Args:
            heads: (depth, rank, q, outcome) per drafted node whose parent was reached; outcome is, greedy,
                1 if it was the target's argmax else 0, and sampling, the target's filtered p(token).
            lookup: (chain position, outcome) likewise, the chain having followed a `match`-gram.
            nodes: the tree's size; with `accepted` (tokens the round yielded) it says whether heads pay.
            heads_ran: the share of the heads that ran (0, 1/K for a probe, 1).
        """
        if heads_ran:
            self._rest_heads(nodes, accepted, greedy, heads_ran)
        mode = self.mode(greedy)
        self.heads_cal[mode].observe([(_row(d, r), q, o) for d, r, q, o in heads])
        self.lookup_cal[mode].observe([(self._chain_row(match, j), 1.0, o) for j, o in lookup])

    # -- pieces -----------------------------------------------------------------
    def _head_estimates(self, q, room: int, mode: str) -> list[list[float]]:
        if q is None:
            return []
        ratios, cut = self.heads_cal[mode].ratios(), bisect.bisect_right
        # = cal.estimate(_row(d, r), x), inlined: it runs for every candidate of every round
        return [[min(1.0, x * ratios[_row(d, r)][cut(BIN_EDGES, x) - 1]) for r, x in enumerate(row)]
                for d, row in enumerate(q[: min(len(q), room)])]

    def _lookup_estimates(self, chain: int, room: int, mode: str, match: int) -> list[float]:
        cal = self.lookup_cal[mode]
        return [cal.estimate(self._chain_row(match, j), 1.0) for j in range(min(chain, room))]

    def _chain_row(self, match: int, j: int) -> int:
        """The lookup calibrator's row of chain position j after a `match`-gram."""
        return (min(max(match, 1), MATCH_CLASSES) - 1) * self._chain_rows + min(j, self._chain_rows - 1)

    def _best_prefix(self, picks: "Iterator[tuple[str, tuple, float]]", greedy: bool
                     ) -> tuple[int, float, list[tuple[str, tuple, float]]]:
        """The prefix of best-first picks with the most expected tokens per second, the heads' time excluded.

        Returns:
            (picks kept, 0 for a plain round; their rate; the picks read, in order).
        """
        times, floor, verify_s, sampled = self._round_s, self._floor_s, self.cost.verify_s, not greedy
        best, best_rate, expected = 0, 1.0 / times[0], 1.0
        read: list[tuple[str, tuple, float]] = []
        for i, pick in enumerate(picks, start=1):
            read.append(pick)
            v = pick[2]
            expected += v  # expected tokens, and about as many nodes visited by verification
            # = cost.round_time(i + 1, False, expected, sampled), term for term
            t = times[i] + verify_s * max(expected - 1.0, 0.0) if sampled else times[i]
            rate = expected / t
            if rate > best_rate:
                best, best_rate = i, rate
            if i + 1 < len(times) and (expected + v * (len(times) - 1 - i)) / floor[i + 1] <= best_rate:
                break  # no bigger tree costs less than floor, and sampled verification only adds to it
        return best, best_rate, read

    def _rest_heads(self, nodes: int, accepted: int, greedy: bool, share: float) -> None:
        """Rest the heads while their rounds' real rate trails plain's (estimates run high where drafted)."""
        got = accepted / self.cost.round_time(nodes, share, accepted, not greedy)
        plain = 1.0 / self._round_s[0]
        if share < 1:
            # A probe yields two tokens at most and one success can be luck, so two in a row bring the heads
            # back and a failure rests them longer.
            self.probe_wins = self.probe_wins + 1 if got > plain else 0
            if self.probe_wins >= 2:  # back, on a fresh trial: the old rate is what rested them
                self.probe_wins, self.backoff, self.heads_rate, self._trial = 0, FIRST_REST, None, []
            elif self.probe_wins:
                self.rest, self.probe = 1, True
            else:
                self._rest()
            return
        rate, mode = self.heads_rate, self.mode(greedy)
        if rate is None:  # judged only after a trial: one unlucky greedy round says little
            self._trial.append(got)
            if len(self._trial) < TRIAL[mode]:
                return
            self.heads_rate, self._trial = sum(self._trial) / len(self._trial), []
        else:
            self.heads_rate = rate + RATE_WEIGHT[mode] * (got - rate)
        # A full round must beat plain clearly to override the running average on its own.
        if got > STRONG * plain or self.heads_rate > REST_BELOW[mode] * plain:
            self.backoff = FIRST_REST
        else:
            self._rest()

    def _rest(self) -> None:
        self.rest, self.backoff = self.backoff, min(4 * self.backoff, MAX_BACKOFF)
        self.probe = True


def _row(depth: int, rank: int) -> int:
    return depth * RANKS + min(rank, RANKS - 1)
