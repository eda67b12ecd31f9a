"""Prometheus metrics, fed only by round events and the request lifecycle.

Every metric lives in the registry passed in, never prometheus_client's global one, so two apps or tests
in one process never share counters. Mean accepted length is `rate(specdec_emitted_tokens_total[5m]) /
rate(specdec_rounds_total[5m])`, both over decoding rounds only.
"""
from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .events import RoundEvent
from .stats import round_depths

_LEN_BUCKETS = (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
_MS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("specdec_requests", "Finished requests by outcome", ["outcome"], registry=r)
        self.rounds = Counter("specdec_rounds", "Decoding rounds (target forwards after the prefill)", registry=r)
        self.draft_tokens = Counter("specdec_draft_tokens", "Draft tree nodes proposed (root excluded)", registry=r)
        self.accepted_tokens = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_depth = Counter("specdec_accepted_tokens_per_depth",
                                          "Draft tokens accepted at each tree depth", ["depth"], registry=r)
        self.rounds_per_depth = Counter("specdec_rounds_reaching_depth",
                                        "Rounds whose tree had nodes at this depth (the per-depth denominator)",
                                        ["depth"], registry=r)
        self.emitted = Counter("specdec_emitted_tokens", "Tokens emitted by decoding rounds, by kind", ["kind"],
                               registry=r)
        self.accepted_length = Histogram("specdec_accepted_length", "Tokens emitted per round", buckets=_LEN_BUCKETS,
                                         registry=r)
        self.round_seconds = Histogram("specdec_round_seconds", "Wall time per round", buckets=_MS, registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Request start to first token", buckets=_MS,
                              registry=r)
        self.tpot = Histogram("specdec_time_per_output_token_seconds", "Decode time per output token after the first",
                              buckets=_MS, registry=r)
        self.e2e = Histogram("specdec_request_seconds", "End-to-end request latency", buckets=_MS + (30, 60),
                             registry=r)
        self.queue_wait = Histogram("specdec_queue_wait_seconds", "Time a request waited for the model",
                                    buckets=_MS + (30, 60), registry=r)
        # Fed by the scheduler (`SchedulerMetrics`), not by round events.
        self.batch_size = Histogram("specdec_batch_size", "Requests decoded together in one round (one target forward)",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.scheduler_wait = Histogram("specdec_scheduler_wait_seconds",
                                        "Time a submitted request waited for a batch slot before its prefill",
                                        buckets=_MS + (30, 60), registry=r)
        self.failures = Counter("specdec_request_failures", "Requests ended by a fault in their own round, by cause",
                                ["cause"], registry=r)
        self.engine_restarts = Counter("specdec_engine_restarts",
                                       "Engine processes started to replace one that ended (specdec.supervisor)",
                                       registry=r)
        self.in_flight = Gauge("specdec_requests_in_flight", "Requests being generated", registry=r)
        self.cache_bytes = Gauge("specdec_prefix_cache_bytes", "Bytes held by the prefix KV cache", registry=r)
        self.cache_hit_ratio = Gauge("specdec_prefix_cache_hit_ratio", "Prefix-cache hits / lookups", registry=r)

    def observe_round(self, ev: RoundEvent) -> None:
        """Count one round event (the prefill only feeds the emitted-token total)."""
        if ev.index == 0:
            return
        self.rounds.inc()
        self.round_seconds.observe(ev.timings.get("total", 0.0) / 1e3)
        self.accepted_length.observe(len(ev.emitted))
        for t in ev.emitted:
            self.emitted.labels(kind=t.kind).inc()
        depth, accepted = round_depths(ev)  # the definitions of specdec.stats
        if depth:
            self.draft_tokens.inc(len(ev.nodes) - 1)
            self.accepted_tokens.inc(accepted)
            for d in range(1, depth + 1):
                self.rounds_per_depth.labels(depth=str(d)).inc()
            for d in range(1, accepted + 1):  # the accepted path holds one node per depth
                self.accepted_per_depth.labels(depth=str(d)).inc()

    def observe_batch(self, size: int) -> None:
        self.batch_size.observe(size)

    def observe_queue_wait(self, seconds: float) -> None:
        self.scheduler_wait.observe(seconds)

    def observe_failure(self, cause: str) -> None:
        self.failures.labels(cause=cause).inc()

    def observe_restart(self) -> None:
        self.engine_restarts.inc()

    def observe_cache(self, cache: dict | None) -> None:
        """The prefix cache's state, as `Engine.info()["prefix_cache"]` gives it (None: no cache)."""
        if cache is not None:
            self.cache_bytes.set(cache["bytes"])
            self.cache_hit_ratio.set(cache["hit_ratio"])


class RequestMetrics:
    """One request's rounds, latencies and outcome in `metrics` (a no-op without), by `begin`/`end` or `with`.

    Latencies are observed for "ok" requests only: a cancelled request's duration is the client's choice.
    """

    def __init__(self, metrics: Metrics | None, arrival: float | None = None,
                 cache_state: Callable[[], dict | None] | None = None) -> None:
        """Args:
            arrival: `time.monotonic()` when the HTTP request arrived (None: the start stands in for it).
            cache_state: reads the prefix cache's state as plain values.
        """
        self.m = metrics
        self.arrival = arrival
        self.cache_state = cache_state or (lambda: None)
        self.cancelled = False
        self.outcome: str | None = None  # set by the caller before `end()`; None ends as "cancelled"
        self.start = self.first = self.last = None
        self.tokens = 0
        self.ended = False

    @property
    def t0(self) -> float:
        """Where the request's latencies start: its arrival when stamped, else its start."""
        return self.arrival if self.arrival is not None else self.start

    def begin(self) -> "RequestMetrics":
        self.start = time.monotonic()
        if self.m is not None:
            self.m.in_flight.inc()
            if self.arrival is not None:
                self.m.queue_wait.observe(max(0.0, self.start - self.arrival))
        return self

    def on_round(self, ev: RoundEvent) -> None:
        """The engine's `on_round` callback: round metrics, time to first token, the token clock."""
        if self.m is None:
            return
        now = time.monotonic()
        self.m.observe_round(ev)
        if ev.emitted:
            if self.first is None:
                self.first = now
                self.m.ttft.observe(now - self.t0)
            self.last = now
            self.tokens += len(ev.emitted)
        if ev.index == 0:
            self.m.observe_cache(self.cache_state())  # the prefill has just looked up and filled it

    def end(self, outcome: str | None = None) -> None:
        """Count the request once, as `outcome` (default: `self.outcome`, else "cancelled")."""
        if self.ended:
            return
        self.ended = True
        if self.m is None:
            return
        outcome = outcome or self.outcome or "cancelled"
        if outcome == "ok":
            self.m.e2e.observe(time.monotonic() - self.t0)
            if self.tokens > 1:
                self.m.tpot.observe((self.last - self.first) / (self.tokens - 1))
        self.m.requests.labels(outcome=outcome).inc()
        self.m.in_flight.dec()
        self.m.observe_cache(self.cache_state())

    def __enter__(self) -> "RequestMetrics":
        return self.begin()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is GeneratorExit or (exc_type is None and self.cancelled):
            self.end("cancelled")
        else:
            self.end("error" if exc_type is not None else "ok")
        return False  # never swallow the exception
