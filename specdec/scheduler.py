"""Continuous batching: one thread owns the model and runs every request's rounds.

Callers `submit` a GenerationRequest (a bad one is a `ValueError` in the caller's thread) and iterate its
`Ticket`. The thread loops: 1. drop cancelled requests; 2. admit waiting ones up to `max_batch_size`;
3. feed up to `prefill_chunk` prompt tokens, then run round 0 of the ready ones (`prefill.first_rounds`);
4. run one batched round, removing requests that finished, failed or should stop. Callable params are read
once per round. A fault ends only its request (`RequestFailed` after its events); an error outside every
request's steps ends those in flight, never the thread.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import Counter, deque
from concurrent.futures import Future
from typing import Callable, Iterator, Protocol

from . import kv_cache, prefill
from .batch import Batch, Member
from .engine import Engine
from .failure import CAUSES, Failure, FaultHook, cause_of, message_of
from .events import RoundEvent
from .request import as_request, callbacks_of
from .threads import off_the_callers_thread
from .ticket import Ticket

log = logging.getLogger(__name__)
DEFAULT_MAX_BATCH_SIZE = 8


class SchedulerMetrics(Protocol):
    """What the scheduler reports as it goes (specdec.metrics.Metrics implements it)."""

    def observe_batch(self, size: int) -> None: ...
    def observe_queue_wait(self, seconds: float) -> None: ...
    def observe_failure(self, cause: str) -> None: ...


class Scheduler:
    """Owns the model: runs the rounds of every submitted request, up to `max_batch_size` at once."""

    def __init__(self, engine: Engine, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, prefill_chunk: int = 256,
                 fault_hook: FaultHook | None = None, metrics: SchedulerMetrics | None = None) -> None:
        """Args:
            max_batch_size: requests decoded together (1: one at a time).
            prefill_chunk: prompt tokens fed per scheduler iteration, between batched rounds.
            fault_hook: fault_hook(request id, round index, step) runs before each request's steps; what it
                raises is that step's failure (for tests).
            metrics: receives batch sizes, queue waits and failures by cause.
        """
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be an integer >= 1, got {max_batch_size!r}")
        if not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool) or prefill_chunk < 1:
            raise ValueError(f"`prefill_chunk` must be an integer >= 1, got {prefill_chunk!r}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self.metrics = metrics
        target = engine.target
        batched, why = target.slots, "the model uses HF's DynamicCache"
        if batched:  # a probe of a few forwards: not on the caller's thread (`specdec.threads`)
            batched, why = off_the_callers_thread(target.device, target.rows_work)
        if not batched:
            log.warning("batched rounds are off for %s (%s): requests share rounds but not forwards",
                        type(target.model).__name__, why)
        self.batched = batched
        self._batch = Batch(engine, max_batch_size, batched, fault_hook)
        self.failures: Counter[str] = Counter({c: 0 for c in CAUSES})
        self.batch_sizes: Counter[int] = Counter()  # rounds run at each batch size
        self._waiting: deque[Ticket] = deque()
        self._prefilling: list[tuple[Ticket, Member | None]] = []
        self._tickets: dict[int, Ticket] = {}  # requests with a batch member (prefilling or decoding)
        self._accepted: dict[int, Ticket] = {}  # every request from `submit` until it ends
        self.lost = 0  # requests found neither queued, prefilling nor decoding, and ended by the idle check
        self._calls: deque[tuple[Callable, Future]] = deque()
        self._cond = threading.Condition()
        self._next_id = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- the callers' side -------------------------------------------------------------------
    def submit(self, request, *fields, on_round=None, should_stop: Callable[[], bool] | None = None,
               on_end: Callable[[Failure | None], None] | None = None, **named) -> Ticket:
        """Queue a request (a GenerationRequest, or its fields); it is checked against the model now.

        Args:
            on_round: callbacks that receive each event (on the scheduler thread) before its client does.
            should_stop: polled once per round; True ends the request after that round's event.
            on_end: called once with the failure (None: it finished, stopped or was cancelled) as the request
                ends, after its last event, on the thread that ends it (the scheduler's, or `close`'s).
        """
        plan = as_request(request, fields, named).plan(self.engine)
        callbacks = callbacks_of(on_round)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            ticket = Ticket(self._next_id, plan, callbacks, should_stop, on_end)
            self._next_id += 1
            self._accepted[ticket.rid] = ticket
            self._waiting.append(ticket)
            self._start()
            self._cond.notify()
        return ticket

    def stream(self, request, *fields, on_round=None, should_stop=None, **named) -> Iterator[RoundEvent]:
        """`submit`, then its events as they come; closing the iterator cancels the request."""
        return iter(self.submit(request, *fields, on_round=on_round, should_stop=should_stop, **named))

    def call(self, fn: Callable, *args, **kwargs):
        """Run `fn` on the scheduler thread between two rounds and return its result."""
        return self.call_soon(fn, *args, **kwargs).result()

    def call_soon(self, fn: Callable, *args, **kwargs) -> Future:
        """`call` without waiting: `fn` runs on the scheduler thread between two rounds; its Future."""
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._calls.append((lambda: fn(*args, **kwargs), fut))
            self._start()
            self._cond.notify()
        return fut

    def stats(self) -> dict:
        """Plain values: request counts by state, `lost` ones (a bug if > 0), failures by cause, batch sizes."""
        with self._cond:
            return {"waiting": len(self._waiting), "prefilling": len(self._prefilling),
                    "decoding": len(self._batch), "tracked": len(self._accepted), "lost": self.lost,
                    "calls": len(self._calls), "batched": self.batched, "max_batch_size": self.max_batch_size,
                    "failures": dict(self.failures), "batch_sizes": dict(sorted(self.batch_sizes.items()))}

    def idle(self, timeout: float = 0.0) -> bool:
        """Whether every accepted request has ended and no call waits, polled up to `timeout` seconds (for tests)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if not (st["tracked"] or st["waiting"] or st["prefilling"] or st["decoding"] or st["calls"]):
                return st["lost"] == 0
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread; requests still queued or running end with a failure."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            atexit.unregister(self._at_exit)

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the scheduler thread ---------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specdec-scheduler", daemon=True)
            self._thread.start()
            # Close before exit, as a daemon thread holding an OpenMP pool can abort the process; a weak
            # reference keeps an unheld scheduler collectable.
            ref = weakref.ref(self)
            self._at_exit = lambda: (ref() is not None and ref().close(timeout=5.0))  # noqa: E731
            atexit.register(self._at_exit)

    def _loop(self) -> None:
        try:
            while self._step():
                pass
        finally:  # also after an error that escaped every guard: no client may wait on a thread that is gone
            with self._cond:
                self._closed = True
            self._shutdown()

    def _step(self) -> bool:
        """One iteration (wait, admit, calls, drop cancelled, prefill, round); False once closed.

        Any error here ends the requests in flight (`_recover`), never the thread.
        """
        with self._cond:
            while not (self._closed or self._waiting or self._prefilling or len(self._batch) or self._calls):
                self._end_lost()
                self._cond.wait()
            if self._closed:
                return False
            calls = list(self._calls)
            self._calls.clear()
            admitted = []
            while self._waiting and len(self._prefilling) + len(self._batch) < self.max_batch_size:
                t = self._waiting.popleft()
                t.started = time.monotonic()
                self._prefilling.append((t, None))
                admitted.append(t)
        try:
            for t in admitted:
                self._observe("observe_queue_wait", t.started - t.submitted)
            for fn, fut in calls:
                if fut.set_running_or_notify_cancel():  # False: its caller cancelled it, and waits for nothing
                    try:
                        fut.set_result(fn())
                    except Exception as e:  # noqa: BLE001 (the caller gets it)
                        fut.set_exception(e)
            self._drop_cancelled()
            self._prefill()
            if len(self._batch):
                self._round()
        except Exception as e:  # noqa: BLE001 (a bug of ours, outside any one request's steps)
            self._recover(e)
        return True

    def _end_lost(self) -> None:
        """End and count (`stats()["lost"]`) requests still accepted when nothing runs; called with the lock held."""
        for t in list(self._accepted.values()):
            log.error("request %d was neither queued nor running: ending it", t.rid)
            self.lost += 1
            self._finish(t, Failure("error", "scheduler", len(t.events), "the scheduler lost this request"))

    def _finish(self, t: Ticket, failure: Failure | None = None) -> None:
        """The one way a request ends: it leaves every record, then its client hears the end."""
        self._tickets.pop(t.rid, None)
        self._accepted.pop(t.rid, None)  # a dict pop: atomic, and `submit` only adds new ids
        t._end(failure)

    def _recover(self, e: Exception) -> None:
        """End the requests in flight with an error outside their steps, then serve on from an empty batch.

        The last resort, so that no client, present or future, waits forever on a dead thread.
        """
        log.exception("scheduler error: ending the requests in flight")
        failure = Failure(cause_of("scheduler", e), "scheduler", 0, message_of(e))
        for t, m in self._prefilling:
            try:
                self._release(m, failed=True)  # a pooled buffer goes back
            except Exception:  # noqa: BLE001 (already recovering)
                log.exception("could not release request %d's buffer", t.rid)
        with self._cond:
            queued = {t.rid for t in self._waiting}
            in_flight = [t for rid, t in self._accepted.items() if rid not in queued]
        # every ticket past the queue: joining, decoding, between the two when it broke, or dropped on the way
        for t in in_flight:
            self._fail(t, failure)
        self._prefilling.clear()
        self._tickets.clear()
        self._batch = Batch(self.engine, self.max_batch_size, self.batched, self._batch.fault_hook)

    def _drop_cancelled(self) -> None:
        with self._cond:  # a request cancelled while queued ends now, not once a slot frees up for it
            gone = [t for t in self._waiting if t.cancelled]
            for t in gone:
                self._waiting.remove(t)
        for t in gone:
            self._finish(t)
        for m in [m for m in self._batch.members if self._tickets[m.rid].cancelled]:
            self._batch.remove(m)
            self._finish(self._tickets[m.rid])
        for t, m in [p for p in self._prefilling if p[0].cancelled]:
            self._prefilling.remove((t, m))
            self._release(m)
            self._finish(t)

    def _prefill(self) -> None:
        """Feed up to `prefill_chunk` prompt tokens, oldest request first; the ready ones run round 0 together."""
        budget, ready = self.prefill_chunk, []
        for entry in list(self._prefilling):
            t, m = entry
            try:
                if m is None:
                    m = Member(t.rid, self.engine.open(t.plan), t.callbacks)
                    self._tickets[t.rid] = t
                    self._prefilling[self._prefilling.index(entry)] = (t, m)
                    entry = (t, m)
                fed = prefill.prefill(self._batch, m, budget)
            except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
                self._prefilling.remove(entry)
                self._release(entry[1], failed=True)
                self._fail(t, Failure(cause_of("prefill", e), "prefill", 0, message_of(e)))
                continue
            if fed:
                break  # the budget is spent: the batch's round comes next
            ready.append(entry)
            budget -= len(t.plan.ids) - kv_cache.length(m.run.cache)  # round 0 feeds the rest
            if budget <= 0:
                break
        if not ready:
            return
        ticket = {m: t for t, m in ready}
        for m, out in prefill.first_rounds(self._batch, list(ticket)):  # in the order given: staged rows move down
            t = ticket[m]
            self._prefilling.remove((t, m))
            self._after(t, m, out.event, out.failure, joined=False)

    def _round(self) -> None:
        size = len(self._batch)
        self.batch_sizes[size] += 1
        self._observe("observe_batch", size)
        for m, out in self._batch.round():
            self._after(self._tickets[m.rid], m, out.event, out.failure, joined=True)

    def _after(self, t: Ticket, m: Member, ev: RoundEvent | None, failure: Failure | None, joined: bool) -> None:
        """Deliver a round's outcome; a request that is done leaves (or never joins) the batch."""
        if ev is not None and not t.cancelled:
            t._deliver(ev)
        stop = False
        if failure is None and m.finished is None and t.should_stop is not None:
            try:
                stop = bool(t.should_stop())
            except Exception as e:  # noqa: BLE001
                failure = Failure("callback", "should_stop", m.index, message_of(e))
        if failure is not None:
            if joined:
                self._batch.remove(m, failed=True)
            else:
                self._release(m, failed=True)
            self._fail(t, failure)
        elif m.finished is not None or stop or t.cancelled:
            if joined:
                self._batch.remove(m)
            else:
                self._release(m)
            self._finish(t)
        elif not joined:
            self._batch.add(m)

    def _release(self, m: Member | None, failed: bool = False) -> None:
        """A request that never joined the batch is done with its KV (its own buffer, or a staged row)."""
        if m is not None:
            self._batch.release(m, failed)

    def _fail(self, t: Ticket, failure: Failure) -> None:
        self.failures[failure.cause] += 1
        log.warning("request %d: %s", t.rid, failure)
        self._finish(t, failure)
        self._observe("observe_failure", failure.cause)

    def _observe(self, name: str, value) -> None:
        """Report to the metrics sink; its own fault is logged and touches no request."""
        if self.metrics is not None:
            try:
                getattr(self.metrics, name)(value)
            except Exception:  # noqa: BLE001 (a figure lost, never a request)
                log.exception("metrics: %s failed", name)

    def _shutdown(self) -> None:
        """Every request not yet ended ends with a failure, and every call waiting gets an error."""
        closed = Failure("error", "shutdown", 0, "the scheduler was closed")
        for m in list(self._batch.members):
            try:
                self._batch.remove(m)
            except Exception:  # noqa: BLE001 (closing: the request ends below either way)
                log.exception("could not remove request %d from the batch", m.rid)
        for t, m in self._prefilling:
            try:
                self._release(m)
            except Exception:  # noqa: BLE001
                log.exception("could not release request %d's buffer", t.rid)
        with self._cond:
            tickets = list(self._accepted.values())
            calls = list(self._calls)
            self._waiting.clear()
            self._calls.clear()
        self._prefilling.clear()
        for t in tickets:
            self._finish(t, closed)
        for _, fut in calls:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError("the scheduler was closed"))
