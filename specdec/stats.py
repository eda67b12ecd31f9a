"""The numbers over round events, defined once: accepted length, per-depth acceptance, throughput, percentiles.

The API, the app, the metrics, the benchmark and the load test all read these, so a figure means the same
thing wherever it is shown. Round 0 is the prefill: it counts for tokens and time, never for acceptance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .events import RoundEvent
from .verifier import LOSSY_RULES


# -- one round ----------------------------------------------------------------------

def decode_rounds(events: Sequence[RoundEvent]) -> list[RoundEvent]:
    """The rounds after the prefill: one target forward each."""
    return [ev for ev in events if ev.index > 0]


def accepted_drafts(ev: RoundEvent) -> int:
    """Drafted tokens the round emitted (cut at EOS or max_new_tokens)."""
    return sum(1 for t in ev.emitted if t.kind == "accepted")


def accepted_sources(ev: RoundEvent) -> list[str]:
    """Who drafted each accepted token, in order: "heads" or "lookup" (a merged chain node: heads)."""
    n = accepted_drafts(ev)
    if not ev.nodes:
        return ["heads"] * n
    return [ev.nodes[i].source for i in ev.accepted_path[1: 1 + n]]


def accepted_by_lookup(ev: RoundEvent) -> int:
    """Accepted tokens of this round that prompt lookup drafted."""
    return sum(1 for s in accepted_sources(ev) if s == "lookup")


def lookup_nodes(ev: RoundEvent) -> int:
    return sum(1 for n in ev.nodes if n.source == "lookup")


def round_depths(ev: RoundEvent) -> tuple[int, int]:
    """(depth the round's tree reached, drafts it accepted); (0, 0) for the prefill and plain rounds."""
    if ev.index == 0 or not ev.nodes:
        return 0, 0
    return max(n.depth for n in ev.nodes), len(ev.accepted_path) - 1


# -- many rounds ----------------------------------------------------------------------

@dataclass
class DepthCounts:
    """Per tree depth d = 1..D: rounds whose tree reached d, and rounds that accepted >= d drafts."""

    reached: list[int] = field(default_factory=list)  # [D]
    accepted: list[int] = field(default_factory=list)  # [D]

    def add(self, depth: int, accepted: int) -> None:
        """Count one speculative round: its tree reached `depth` and it accepted `accepted` drafts."""
        grow = depth - len(self.reached)
        if grow > 0:
            self.reached += [0] * grow
            self.accepted += [0] * grow
        for d in range(depth):
            self.reached[d] += 1
            self.accepted[d] += accepted > d

    def __add__(self, other: "DepthCounts") -> "DepthCounts":
        out = DepthCounts(list(self.reached), list(self.accepted))
        for d, (n, a) in enumerate(zip(other.reached, other.accepted)):
            if d >= len(out.reached):
                out.reached.append(0)
                out.accepted.append(0)
            out.reached[d] += n
            out.accepted[d] += a
        return out

    def rates(self) -> list[float]:
        """accepted / reached at each depth (never 0): rounds whose tree stopped short of d don't count."""
        return [a / n for a, n in zip(self.accepted, self.reached)]

    def given_previous(self) -> list[float | None]:
        """P(accept >= d | accepted >= d-1): accepted at d over accepted at d-1 (reached, at d = 1)."""
        prev = self.reached[:1] + self.accepted[:-1]
        return [a / p if p else None for a, p in zip(self.accepted, prev)]

    def rows(self) -> list[dict]:
        """One plain row per depth, for charts and tables."""
        return [{"depth": d + 1, "reached": n, "accepted": a, "rate": r, "given_prev": g}
                for d, (n, a, r, g) in enumerate(zip(self.reached, self.accepted, self.rates(),
                                                     self.given_previous()))]


def depth_counts(events: Iterable[RoundEvent]) -> DepthCounts:
    out = DepthCounts()
    for ev in events:
        depth, accepted = round_depths(ev)
        if depth:
            out.add(depth, accepted)
    return out


def mean_accepted_length(events: Sequence[RoundEvent]) -> float | None:
    """Tokens per target forward over decoding rounds (plain decoding: 1.0); None before the first one."""
    dec = decode_rounds(events)
    return sum(len(ev.emitted) for ev in dec) / len(dec) if dec else None


def tree_size(ev: RoundEvent) -> int:
    """Nodes the round's target forward verified, root included: 1 for a plain round."""
    return max(len(ev.nodes), 1)


def expected_length_errors(events: Sequence[RoundEvent]) -> list[float]:
    """|expected - verified| tokens per dynamic-tree round; verified: accepted drafts + 1, before any cut."""
    return [abs(ev.expected_length - len(ev.accepted_path)) for ev in decode_rounds(events)
            if ev.expected_length is not None and ev.accepted_path]


def expected_length_error(events: Sequence[RoundEvent]) -> float | None:
    """Mean absolute error of the dynamic tree's expected tokens per round (None without such rounds)."""
    errs = expected_length_errors(events)
    return sum(errs) / len(errs) if errs else None


def throughput(tokens: float, seconds: float | None) -> float | None:
    """tokens / seconds, or None without a positive duration."""
    return tokens / seconds if seconds is not None and seconds > 0 else None


def engine_seconds(events: Sequence[RoundEvent]) -> float:
    """Time spent inside the engine's rounds (their own clocks), prefill included."""
    return sum(ev.timings.get("total", 0.0) for ev in events) / 1e3


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of values at or below it (q in [0, 100]), or None."""
    s = sorted(values)
    if not s:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"`q` must be in [0, 100], got {q!r}")
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...} by nearest rank."""
    s = sorted(values)
    return {f"p{q:g}": percentile(s, q) for q in qs}


def is_lossy(rule: str) -> bool:
    return rule in LOSSY_RULES


def rule_label(rule: str) -> str:
    """An acceptance rule as the UI writes it: lossy rules say so."""
    return rule + (" (LOSSY)" if is_lossy(rule) else "")


SAMPLER_KEYS = ("temperature", "top_k", "top_p", "min_p")  # the settings a live source may change mid-run


def params_changed(prev: dict | None, cur: dict) -> dict[str, tuple]:
    """{key: (old, new)} for the sampler settings that differ between two events' params."""
    if prev is None:
        return {}
    return {k: (prev.get(k), cur.get(k)) for k in SAMPLER_KEYS if prev.get(k) != cur.get(k)}


def change_rounds(events: Sequence[RoundEvent]) -> list[tuple[int, dict]]:
    """[(round index, {key: (old, new)})] for every round whose sampler settings differ from the round before."""
    out, prev = [], None
    for ev in events:
        ch = params_changed(prev, ev.params)
        if ch:
            out.append((ev.index, ch))
        prev = ev.params
    return out


def summarize(events: Sequence[RoundEvent], wall_seconds: float | None = None) -> dict:
    """A run's totals as plain values: tokens_per_second by the engine's clocks, wall_* by `wall_seconds`."""
    dec = decode_rounds(events)
    new = sum(len(ev.emitted) for ev in events)
    engine_s = engine_seconds(events)
    rules = sorted({ev.acceptance for ev in dec}) or sorted({ev.acceptance for ev in events})
    return {
        "rounds": len(dec),
        "target_forwards": len(events),
        "new_tokens": new,
        "accepted_drafts": sum(accepted_drafts(ev) for ev in dec),
        "lookup_drafts": sum(accepted_by_lookup(ev) for ev in dec),  # of accepted_drafts
        "lookup_rounds": sum(1 for ev in dec if lookup_nodes(ev)),  # rounds that drafted by prompt lookup
        "mean_accepted_length": mean_accepted_length(events),
        "mean_tree_nodes": sum(tree_size(ev) for ev in dec) / len(dec) if dec else None,
        "expected_length_error": expected_length_error(events),
        "engine_seconds": engine_s,
        "tokens_per_second": throughput(new, engine_s),
        "seconds": wall_seconds,
        "wall_tokens_per_second": throughput(new, wall_seconds),
        # the decode rounds alone (no prefill, no queue wait): what a longer run converges to
        "decode_tokens_per_second": throughput(sum(len(ev.emitted) for ev in dec), engine_seconds(dec)),
        "finished": events[-1].finished if events else None,
        "rules": rules,
        "lossy": any(is_lossy(r) for r in rules),
        "speculative": bool(events and events[0].speculative),
        "changes": len(change_rounds(events)),
    }
