"""Serving plumbing: the `/metrics` route, request arrival stamps, and one request's lifecycle metrics.

The app makes one `specdec.metrics.Metrics` and hands it both to the
handlers (which feed it) and to `app_kwargs` (which serves it). Nothing
here is a module global: two apps in one process count separately.

Lifecycle of one Generate request, as the metrics see it:

    arrival (queue/join POST) -> handler starts -> first token -> last token -> handler ends
    |-------- queue wait -----|                                                            |
    |------------------ time to first token --------|                                      |
                                                    |-- TPOT x (n-1) --|                   |
    |----------------------------------------- end-to-end ------------------------------------|

The arrival is stamped by `ArrivalStamp` on the HTTP request that Gradio
keeps with the queued event; where no stamp exists (a direct call, a
mounted app without the middleware), the handler's start stands in for
it and the queue wait is not observed.
"""
from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from specdec import RoundEvent
from specdec.metrics import Metrics

ARRIVAL_KEY = "specdec_arrival"  # in the ASGI scope's request state: time.monotonic() at arrival


class ArrivalStamp:
    """ASGI middleware: record when each HTTP request arrived (`request.state.specdec_arrival`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVAL_KEY] = time.monotonic()
        await self.app(scope, receive, send)


def arrival_time(request) -> float | None:
    """The arrival stamp of a `gr.Request` (or a Starlette request), or None when there is none."""
    if request is None:
        return None
    try:
        return getattr(request.state, ARRIVAL_KEY, None)
    except AttributeError:  # a gr.Request without an HTTP request behind it
        return None


def metrics_route(metrics: Metrics, path: str = "/metrics") -> Route:
    """A Starlette route that serves `metrics` in the Prometheus text format."""

    async def endpoint(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Route(path, endpoint, methods=["GET"])


def app_kwargs(metrics: Metrics) -> dict:
    """FastAPI constructor arguments for `demo.launch(app_kwargs=...)`: `/metrics` and arrival stamps.

    Routes given to the constructor come before Gradio's own, so nothing of Gradio's shadows them.
    """
    return {"routes": [metrics_route(metrics)], "middleware": [Middleware(ArrivalStamp)]}


class RequestMetrics:
    """One request's lifecycle, as a context manager around the handler's body (a no-op without metrics).

    Outcome: "error" when the body raises (a `gr.Error` included), "cancelled" when the generator is
    closed (Stop, a client disconnect) or `cancelled` was set (Stop seen by the engine), else "ok".
    Latencies (TPOT, end-to-end) are observed for "ok" requests only: a cancelled request's duration
    is the user's choice, not the server's speed.
    """

    def __init__(self, metrics: Metrics | None, arrival: float | None = None,
                 cache_state: Callable[[], dict | None] | None = None) -> None:
        """cache_state: reads the prefix cache's state as plain values (`ModelGate.prefix_cache`)."""
        self.m = metrics
        self.arrival = arrival
        self.cache_state = cache_state or (lambda: None)
        self.cancelled = False
        self.start = self.first = self.last = None
        self.tokens = 0

    def __enter__(self) -> "RequestMetrics":
        self.start = time.monotonic()
        if self.m is not None:
            self.m.in_flight.inc()
            if self.arrival is not None:
                self.m.queue_wait.observe(max(0.0, self.start - self.arrival))
        return self

    @property
    def t0(self) -> float:
        """Where the request's latencies start: its arrival when stamped, else the handler's start."""
        return self.arrival if self.arrival is not None else self.start

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

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.m is None:
            return False
        if exc_type is GeneratorExit or (exc_type is None and self.cancelled):
            outcome = "cancelled"
        elif exc_type is not None:
            outcome = "error"
        else:
            outcome = "ok"
        end = time.monotonic()
        if outcome == "ok":
            self.m.e2e.observe(end - self.t0)
            if self.tokens > 1:
                self.m.tpot.observe((self.last - self.first) / (self.tokens - 1))
        self.m.requests.labels(outcome=outcome).inc()
        self.m.in_flight.dec()
        self.m.observe_cache(self.cache_state())
        return False  # never swallow the exception
