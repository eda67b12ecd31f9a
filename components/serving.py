"""Serving plumbing: the `/metrics` route and request arrival stamps (a request's lifecycle metrics are
`specdec.metrics.RequestMetrics`).

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

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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
