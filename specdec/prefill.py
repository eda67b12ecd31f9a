"""Round 0 of joining requests: their prompt fed in chunks, then each one's first token.

A long prompt is fed `prefill_chunk` tokens per scheduler iteration so it never stalls the batch for long;
requests whose rest then fits run round 0 together in one forward where that pays, in rows staged after the
members', then join the batch (`Batch.add`). An `Engine.stream` runs round 0 on its own buffer. Faults stay
with their request.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from . import kv_cache
from .failure import Failure, Outcome, failed
from .stopwatch import Stopwatch

if TYPE_CHECKING:
    from .batch import Batch, Member


def prefill(batch: "Batch", m: Member, budget: int) -> int:
    """Feed up to `budget` prompt tokens of a joining request, leaving its last chunk to round 0.

    Returns the tokens fed; 0 when the rest fits the budget (`first_rounds` runs it next).
    """
    run = m.run
    start = kv_cache.length(run.cache)
    rest = len(run.plan.ids) - start
    if rest <= budget:
        return 0
    batch.hook(m, "prefill")
    hidden = batch.engine.target.forward(torch.tensor(run.plan.ids[start : start + budget], dtype=torch.long),
                                        run.cache, taps=run.eagle is not None)
    batch.engine.fed(run, hidden, start)
    return budget


def first_rounds(batch: "Batch", ms: list[Member]) -> list[tuple[Member, Outcome]]:
    """Round 0 of requests whose prompt (its rest) is now fed: each one's first token.

    Returns (member, outcome) in the order to take them: the shared forward's in their staged rows (`add`
    moves a staged row down, never onto one not yet taken), then those run on their own buffer.
    """
    shared = _sharing(batch, ms)
    out = _shared_first_rounds(batch, shared) if shared else []
    return out + [(m, _first_round(batch, m)) for m in ms if m not in shared]


def _sharing(batch: "Batch", ms: list[Member]) -> list[Member]:
    """The joining requests that share round 0's forward, shortest rest first (none: each alone).

    Rows are padded to the longest rest, so a request joins only while that fits the buffer and at most
    doubles the real tokens; with CUDA graphs only in an empty batch, since rows after members' run eagerly.
    """
    if not batch.batched or len(ms) < 2 or (batch.engine.target.graphs is not None and batch.members):
        return []
    capacity = max(kv_cache.bucket(m.run.cache.capacity) for m in ms)
    if batch.cache is not None:
        capacity = max(capacity, batch.cache.capacity)
    group, starts, rests = [], [], []
    for m in sorted(ms, key=lambda m: len(m.run.plan.ids) - kv_cache.length(m.run.cache)):
        start = kv_cache.length(m.run.cache)
        rest = len(m.run.plan.ids) - start
        b, T = len(group) + 1, max(rests + [rest])
        if max(starts + [start]) + T <= capacity and b * T <= max(2 * (sum(rests) + rest), 16 * b):
            group.append(m)
            starts.append(start)
            rests.append(rest)
    return group if len(group) >= 2 else []


def _shared_first_rounds(batch: "Batch", ms: list[Member]) -> list[tuple[Member, Outcome]]:
    """Round 0 of `ms` in one forward over staged rows; their own buffers go back after, zeroed if it failed."""
    outcome: dict[int, Outcome] = {}
    clocks: dict[int, Stopwatch] = {}
    live, solos, tokens = [], {}, []
    lo = len(batch.members)
    try:
        for i, m in enumerate(ms):
            clocks[i] = Stopwatch()  # laps: the shared forward with its own commit, then its token
            clocks[i].lap("draft")
            solo = m.run.cache
            try:
                batch.hook(m, "forward")
                batch.stage(m, lo + len(live), release=False)
            except Exception as e:  # noqa: BLE001 (isolated: it ends, still holding its own buffer)
                outcome[i] = failed("forward", e, m.index)
                continue
            solos[i] = solo
            live.append(i)
            tokens.append(m.run.plan.ids[kv_cache.length(m.run.cache):])  # [n_i]: never empty
        t0 = time.perf_counter()
        hidden = _prompt_rows(batch, ms, live, lo, tokens, outcome)
        forward_ms = (time.perf_counter() - t0) * 1e3
        for i, n in zip(live, map(len, tokens)):
            if i not in outcome:
                outcome[i] = _commit_prompt(batch, ms[i], hidden[i], n, clocks[i], forward_ms, len(live))
    finally:
        for i, solo in solos.items():
            batch.engine.target.release(solo, failed=i not in outcome or outcome[i].failure is not None)
    return [(ms[i], outcome[i]) for i in live] + [(ms[i], outcome[i]) for i in range(len(ms)) if i not in live]


def _commit_prompt(batch: "Batch", m: Member, hidden: torch.Tensor, n: int, clock: Stopwatch, forward_ms: float,
                   size: int) -> Outcome:
    """A staged request after the shared forward: commit its prompt's rest (`hidden` [n, H]), then its token."""
    try:
        start = time.perf_counter()
        first = kv_cache.length(m.run.cache)
        batch.engine.fed(m.run, hidden, first)
        hidden = hidden[n - 1 : n]  # the prompt's last row gives the first token
        kv_cache.keep_path(m.run.cache, first, list(range(n)))  # the chain: the prompt
        if batch.engine.prefix_cache is not None:
            batch.engine.prefix_cache.insert(m.run.plan.ids, m.run.cache)
    except Exception as e:  # noqa: BLE001 (isolated, as in `Engine.forward` on its own buffer)
        return failed("forward", e, m.index)
    clock.last = time.perf_counter()
    clock.ms["forward"] = forward_ms + (clock.last - start) * 1e3  # the shared forward, then its own commit
    return batch.finish(m, None, hidden, m.run.plan.first, clock, size=size)


def _prompt_rows(batch: "Batch", ms: list[Member], live: list[int], lo: int, tokens: list[list[int]],
                 outcome: dict) -> dict[int, torch.Tensor]:
    """The staged prompt rests as chains in rows from `lo` -> [n_i, H] each; alone if the shared forward fails."""
    try:
        taps = any(ms[i].run.eagle is not None for i in live)
        rows = batch.engine.target.forward_rows(batch.cache, lo, tokens, [None] * len(live), taps)  # [b, T, H]
        out = {i: rows[j, : len(tokens[j])] for j, i in enumerate(live)}
    except Exception:  # noqa: BLE001 (the shared forward failed: retry each request alone)
        out = {}
        for j, i in enumerate(live):
            try:
                out[i] = batch.engine.target.forward_rows(batch.cache, lo + j, [tokens[j]], [None],
                                                         ms[i].run.eagle is not None)[0]
            except Exception as e:  # noqa: BLE001
                outcome[i] = failed("forward", e, ms[i].index)
    return batch.check_finite(ms, out, outcome)


def _first_round(batch: "Batch", m: Member) -> Outcome:
    """Round 0 on the request's own buffer: the rest of the prompt in one forward, then the first token."""
    eng, run = batch.engine, m.run
    params = run.plan.first
    clock = Stopwatch()
    clock.lap("draft")
    try:
        batch.hook(m, "forward")
        hidden = eng.forward(run, None)
    except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
        return failed("forward", e, m.index)
    clock.lap("forward")
    if not bool(torch.isfinite(hidden).all()):
        return Outcome(None, Failure("non_finite", "forward", m.index, "the target's hidden state has NaN or inf values"))
    return batch.finish(m, None, hidden, params, clock, size=1)
