"""The dynamic draft tree ("auto"): each round, the tree worth most accepted tokens per second.

EAGLE-2 (Li et al., 2024) grows each round's tree from the draft's own confidence instead of
using one static shape. specdec does the same from Medusa heads:

1. score: a candidate node's chance of being accepted is the product, along its path, of
   calibrated per-node estimates a_dr(q), where q is head d's probability for its rank-r token
   under the round's own sampler settings (temperature, top-k, top-p, min-p: the filtered law
   that the target is verified with), or the plain softmax when decoding greedily;
2. calibrate: a_dr(q) = min(1, q * ratio[d, r][bin(q)]), where ratio tracks, with decay, what
   verification actually gave for nodes with that score: for greedy, whether the node was the
   target's argmax; for sampling, the target's filtered probability p(x) of the node's token,
   which is exactly the chance that the lossless rule accepts it (Leviathan et al., q a point mass).
   Greedy rounds also learn every candidate they did not draft under the accepted path (its
   outcome is known there), so a low-scored sibling's estimate is not stuck at its prior;
3. grow: nodes are taken best-first (every factor is <= 1, so a child never beats its parent
   and each prefix of the order is the best tree of its size). Prompt-lookup chain nodes are
   candidates in the same order, with their own calibrated estimate per chain position and per
   length of the n-gram the chain follows (a 3-gram's chain is far likelier than a 1-gram's);
4. size: the round keeps the prefix with the most expected tokens per second under the measured
   `CostModel`, down to the root alone (a plain round) when nothing is worth drafting.

When the rounds that ran the heads yield less per second than plain rounds (a slow running average;
in greedy decoding first judged after a trial, and only below 0.8x plain there), the heads rest for 4,
16, 64 rounds (lookup chains can still be drafted meanwhile) and are then probed again, with their first
head alone (a quarter of the cost); two probes in a row that pay bring them all back, on a fresh trial.

Every choice is a function of committed tokens, the round's params and the policy's state,
which only earlier rounds' verdicts update, so a round's tree never depends on its own random
draws: greedy output and the sampled law are exactly those of plain decoding, for any tree.
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
# The ratio of acceptance to score before any evidence. Heads distilled on a target's outputs are
# overconfident about its *sampled* tokens (measured on the embedded model at T = 0.7 and 1.0:
# 0.4-0.9, lower for confident heads) and about right, or under, for its argmax.
PRIOR = {"greedy": 1.0, "sampled": 0.6}
# A lookup token's acceptance before any evidence, by the length of the n-gram the chain follows
# (1, 2, 3 or more) and by chain position: once one is accepted the context is repeating, and later
# tokens are likelier (each estimate is conditional on its parent). Measured on the embedded model
# (`lookup.NgramIndex.match`), first token after a 1-, 2- and 3-gram match: greedy 0.39, 0.75, 0.95;
# T = 0.7 0.34, 0.49, 0.69; T = 1.0 0.16, 0.32, 0.62.
MATCH_CLASSES = 3  # chains are calibrated apart after a 1-gram, a 2-gram and a longer match
LOOKUP_PRIOR = {"greedy": ((0.4, 0.8), (0.7, 0.9), (0.9, 0.95)), "sampled": ((0.2, 0.5), (0.35, 0.6), (0.6, 0.7))}
# How fast the heads' running rate follows new rounds, and how many full rounds they run before it
# is first judged (cold, or back from a rest). Greedy: slow, after a trial. On distilled heads a bad
# greedy stretch says little about the next rounds (measured: the least promising quarter of contexts
# still paid for a chain), so a rest costs more than it saves; heads that do not pay (random heads)
# show it in their average a few rounds later. Sampled: fast, at once. Sampled heads are on trial
# from their first probe, and at a hot temperature a longer trial only pays for more losing rounds.
RATE_WEIGHT = {"greedy": 0.1, "sampled": 0.3}
TRIAL = {"greedy": 4, "sampled": 1}
# The heads rest when their running rate falls below this share of plain decoding's. Greedy: 0.8. The
# rate is priced by the load-time cost model, whose heads-to-plain ratio varied over 0.33-0.55 between
# loads on the embedded model's CPU; at 1.0, loads that priced the heads high rested distilled heads
# that were paying (greedy tau 3.4 against 4.0 for the static tree in the same process). Heads that do
# not pay in greedy decoding (random ones) yield about one token for twice a plain round's time, far
# below 0.8. Sampled: 1.0, where drafted heads pay only narrowly (or not) at a hot temperature.
REST_BELOW = {"greedy": 0.8, "sampled": 1.0}
GAIN_WEIGHT = 0.3  # how fast the running average of what the heads' nodes added to a tree follows new rounds
RANKS = 3  # calibration rows per head: rank 0, rank 1, ranks 2+ (a head's first guess is special)
MIN_VALUE = 1e-4  # nodes less likely than this are never worth a slot
# Rests of 4, 16, 64 rounds: a 64-token request at a temperature where the heads never pay
# probes them about three times. They cost more than their own forward: on a CPU their weights
# evict the target's from cache, and the next forwards pay for it (measured: plain rounds 11%
# slower when the heads ran on one round in ten).
MAX_BACKOFF = 64  # rounds the heads rest at most before they are tried again
FIRST_REST = 4
STRONG = 1.5  # a single full round this much faster than plain brings the heads straight back


def head_scores(logits: torch.Tensor, params: SamplingParams, k: int = TOPK
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each head's top-k candidates, their softmax q (shown in the UI) and their score.

    The score is the candidate's probability under the round's filters applied to the head's law
    (`sampler.target_probs`, the law the target is verified with), or q itself when decoding greedily.

    Args:
        logits: [D, V] head logits.
    Returns:
        q [D, k] float32, token ids [D, k] long, score [D, k] float32.
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
    """One request's tree policy: calibration state and the heads' rest schedule, learned from its own verdicts."""

    def __init__(self, num_heads: int, cost: CostModel, max_nodes: int | None = None, lookup: int = 0) -> None:
        self.cost = cost
        self.max_nodes = min(max_nodes or cost.max_nodes, cost.max_nodes)
        # The cost model is fixed for the request: a plain-round-style T(n) (heads excluded, their time
        # is spent either way once they ran) per tree size, so sizing a tree costs a list lookup per node.
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
        # The next heads round runs the first head alone: after a rest, and on a sampled request's
        # first round, before anything says the heads pay at its temperature (a greedy request opens
        # with every head: distilled heads usually pay there, and a probe would cost its first rounds).
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
        """How many heads this round runs: none while they rest, or when the lookup chain alone is
        expected to be faster than the chain plus what the heads' nodes recently added (their
        forward is then saved); the first one alone to probe after a rest; else all of them."""
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
            # The heads' nodes add tokens where the chain's first token is rejected: where it is accepted,
            # their depth-1 guesses are its rejected siblings (or the same token, merged).
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
            # Once the heads ran, draft at least their best node: a round without one teaches the
            # calibration nothing, and a cold estimate could then never warm up.
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
        """Learn from a verdict: heads' (depth, rank, q, outcome) and lookup's (position, outcome),
        the chain having followed a `match`-gram.

        The outcome of a drafted node whose parent was reached is, for greedy decoding, 1 if the
        target's argmax was its token, else 0; for sampling, the target's filtered p(token).
        `nodes` and `accepted` (tokens the round yielded) judge whether the heads pay their way;
        `heads_ran` is the share of the heads that ran (0, 1/K for a probe, 1).
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
        """How many picks to keep, and its rate: the most expected tokens per second (0 = a plain round).
        Also the picks it read, in order.

        The heads' own time is spent either way once they ran, so it does not count here. Picks come
        best first, so no later one is worth more than the last read: once even `budget` more of that
        worth at no extra time could not beat the best rate, the rest is not read (same answer).
        """
        times, floor, verify_s, sampled = self._round_s, self._floor_s, self.cost.verify_s, not greedy
        best, best_rate, expected = 0, 1.0 / times[0], 1.0
        read: list[tuple[str, tuple, float]] = []
        for i, pick in enumerate(picks, start=1):
            read.append(pick)
            v = pick[2]
            expected += v  # ... tokens, and about as many nodes visited by verification
            # = cost.round_time(i + 1, False, expected, sampled), term for term
            t = times[i] + verify_s * max(expected - 1.0, 0.0) if sampled else times[i]
            rate = expected / t
            if rate > best_rate:
                best, best_rate = i, rate
            if i + 1 < len(times) and (expected + v * (len(times) - 1 - i)) / floor[i + 1] <= best_rate:
                break  # no bigger tree costs less than floor, and sampled verification only adds to it
        return best, best_rate, read

    def _rest_heads(self, nodes: int, accepted: int, greedy: bool, share: float) -> None:
        """After a round that ran the heads: rest them while their rounds are no faster than plain ones.

        Judged on what rounds with the heads actually yielded per second (a running average), not
        on what they promised: the policy drafts exactly where its estimates are highest, which is
        also where they are most often too high.
        """
        got = accepted / self.cost.round_time(nodes, share, accepted, not greedy)
        plain = 1.0 / self._round_s[0]
        if share < 1:
            # A probe (one head, a depth-1 tree) yields two tokens at most, and one success can be
            # luck (a flat law accepts a depth-1 draft a quarter of the time): two in a row bring
            # the heads back; a failure rests them longer.
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
