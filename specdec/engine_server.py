"""The engine's process: it loads the model, runs its scheduler, and answers the caller's messages on one pipe.

Events go back from the scheduler's thread as each round ends, and a request's end after its last event;
messages are plain picklable values.
"""
from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from concurrent.futures import Future
from typing import Callable

from .events import RoundEvent
from .request import GenerationRequest

log = logging.getLogger(__name__)


class _MetricsRelay:
    """The scheduler's metrics (batch sizes, queue waits, failures), sent to the caller's registry."""

    def __init__(self, send: Callable) -> None:
        self._send = send

    def observe_batch(self, size: int) -> None:
        self._send(("metric", "observe_batch", size))

    def observe_queue_wait(self, seconds: float) -> None:
        self._send(("metric", "observe_queue_wait", seconds))

    def observe_failure(self, cause: str) -> None:
        self._send(("metric", "observe_failure", cause))


def _timed_next(stream) -> tuple[RoundEvent | None, float]:
    t0 = time.perf_counter()
    ev = next(stream, None)
    return ev, time.perf_counter() - t0


class _Server:
    """The engine's side: one loop over the caller's messages; events go back from the scheduler's thread."""

    def __init__(self, conn, load_kwargs: dict, threads) -> None:
        self.conn = conn
        self.load_kwargs = load_kwargs
        self.threads = threads
        self.send_lock = threading.Lock()
        self.tickets: dict = {}
        self.params: dict[int, object] = {}  # live requests' newest SamplingParams
        self.stops: set[int] = set()
        self.lanes: dict = {}

    def send(self, msg) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def run(self) -> None:
        from . import api, threads
        from .prefix_cache import PrefixCache
        kwargs = dict(self.load_kwargs)
        if kwargs.get("prefix_cache") is not None:  # a budget in bytes: the cache itself lives here
            kwargs["prefix_cache"] = PrefixCache(max_bytes=kwargs["prefix_cache"])
        try:
            self.loaded = api.load(**kwargs)
        except ValueError as e:  # a model specdec refuses: the caller raises it
            self.send(("load_error", str(e)))
            return
        line = threads.serving_threads(self.loaded, self.threads)
        engine = self.loaded.engine
        self.send(("ready", {"tokenizer": self.loaded.tokenizer, "name": self.loaded.name,
                             "max_batch_size": self.loaded.max_batch_size, "device": str(self.loaded.device),
                             "info": engine.info(), "threads": line}))
        try:
            while True:
                try:
                    msg = self.conn.recv()
                except EOFError:  # the caller is gone
                    break
                if msg[0] == "close":
                    break
                try:
                    getattr(self, "_" + msg[0])(*msg[1:])
                except Exception:  # noqa: BLE001 (a bad message must not end the engine; calls answer in _reply)
                    log.exception("engine process: message %r failed", msg[0])
        finally:
            if self.loaded.serving:
                self.loaded.scheduler.close()

    def _answer(self, cid: int, ok: bool, value) -> None:
        try:
            self.send(("ret", cid, ok, value))
        except Exception as e:  # noqa: BLE001 (a value that does not pickle: the caller still gets an answer)
            self.send(("ret", cid, False, RuntimeError(f"the engine's answer could not be sent: {e}")))

    def _reply(self, cid: int, fn: Callable, *args) -> None:
        try:
            value = fn(*args)
        except Exception as e:  # noqa: BLE001 (the caller raises it)
            self._answer(cid, False, e)
        else:
            self._answer(cid, True, value)

    def _reply_later(self, cid: int, fut: Future) -> None:
        def done(f: Future) -> None:
            e = f.exception()
            self._answer(cid, e is None, f.result() if e is None else e)
        fut.add_done_callback(done)

    # -- messages ----------------------------------------------------------------------------------
    def _serve(self, cid: int, fault_hook, metrics: bool) -> None:
        def serve():
            sched = self.loaded.serve(metrics=_MetricsRelay(self.send) if metrics else None, fault_hook=fault_hook)
            sched.call_soon(self.loaded.engine.cost_model)  # measured now, not in the first request
        self._reply(cid, serve)

    def _submit(self, cid: int, rid: int, request: GenerationRequest, live: bool) -> None:
        def submit():
            req = request
            if live:  # the newest value the caller sent, read once per round
                self.params[rid] = request.params
                req = dataclasses.replace(request, params=lambda: self.params[rid])
            self.tickets[rid] = self.loaded.scheduler.submit(
                req, on_round=lambda ev: self.send(("ev", rid, ev)), should_stop=lambda: rid in self.stops,
                on_end=lambda failure: self._ended(rid, failure))
            if self.tickets[rid].done.is_set():  # it ended before it was filed here (a prefill that failed)
                self.tickets.pop(rid, None)
        self._reply(cid, submit)

    def _ended(self, rid: int, failure) -> None:  # after its last event went out, on the same thread
        self.send(("end", rid, failure))
        self.tickets.pop(rid, None)
        self.params.pop(rid, None)
        self.stops.discard(rid)

    def _params(self, rid: int, params) -> None:
        if rid in self.params:
            self.params[rid] = params

    def _stop(self, rid: int) -> None:
        self.stops.add(rid)

    def _cancel(self, rid: int) -> None:
        ticket = self.tickets.get(rid)
        if ticket is not None:
            ticket.cancel()

    def _info(self, cid: int) -> None:
        self._reply(cid, self.loaded.engine.info)

    def _stats(self, cid: int) -> None:
        self._reply(cid, self.loaded.scheduler.stats)

    def _sampler_rows(self, cid: int, *args) -> None:
        self._reply_later(cid, self.loaded.scheduler.call_soon(self.loaded.engine.sampler_rows, *args))

    def _lane_open(self, cid: int, lid: int, request: GenerationRequest) -> None:
        def open_():
            self.lanes[lid] = self.loaded.engine.stream(request)
        self._reply(cid, open_)

    def _lane_next(self, cid: int, lid: int) -> None:
        lane = self.lanes.get(lid)
        if lane is None:  # closed already
            self._answer(cid, True, (None, 0.0))
            return
        self._reply_later(cid, self.loaded.scheduler.call_soon(_timed_next, lane))

    def _lane_close(self, lid: int) -> None:
        lane = self.lanes.pop(lid, None)
        if lane is not None:
            self.loaded.scheduler.call_soon(lane.close)


def serve_engine(conn, load_kwargs: dict, threads) -> None:
    """The engine process's entry point: load the model, then answer the caller's messages until it closes."""
    # Ctrl-C reaches the whole process group: the caller decides, and its exit closes the pipe (EOF ends us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="engine: %(levelname)s %(name)s: %(message)s")
    _Server(conn, load_kwargs, threads).run()


