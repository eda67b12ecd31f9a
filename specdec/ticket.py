"""A request's handle: `Ticket` in this process's scheduler, `RemoteTicket` in the engine's process."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator

from .events import RoundEvent
from .failure import Failure, RequestFailed, message_of

if TYPE_CHECKING:
    from .supervisor import Connection

log = logging.getLogger(__name__)
_END = object()


class Ticket:
    """A client's handle on one request: iterate it for the events; `cancel()` frees its slot by the next round.

    A failed request raises RequestFailed after its events; closing the iterator early cancels the request.
    """

    def __init__(self, rid: int, plan, callbacks: list, should_stop: Callable[[], bool] | None,
                 on_end: Callable[[Failure | None], None] | None = None) -> None:
        self.rid = rid
        self.plan = plan
        self.callbacks = callbacks
        self.should_stop = should_stop
        self.on_end = on_end
        self.events: list[RoundEvent] = []
        self.failure: Failure | None = None
        self.submitted = time.monotonic()
        self.started: float | None = None  # when its prefill began (the end of its queue wait)
        self.done = threading.Event()
        self._cancelled = False
        self._items: deque = deque()
        self._ready = threading.Condition()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop this request: the scheduler drops it before its next round (nothing more is delivered)."""
        self._cancelled = True

    def __iter__(self) -> Iterator[RoundEvent]:
        try:
            while True:
                with self._ready:
                    while not self._items:
                        self._ready.wait()
                    item = self._items.popleft()
                if item is _END:
                    break
                yield item
        finally:
            if not self.done.is_set():
                self.cancel()  # the client stopped reading: free the slot
        if self.failure is not None:
            raise RequestFailed(self.failure, self.events)

    def result(self, timeout: float | None = None) -> list[RoundEvent]:
        """Wait for the end and return every event (RequestFailed if it failed)."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"request {self.rid} still running after {timeout} s")
        if self.failure is not None:
            raise RequestFailed(self.failure, self.events)
        return list(self.events)

    # -- the scheduler's side --------------------------------------------------------------
    def _put(self, item) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def _deliver(self, ev: RoundEvent) -> None:
        self.events.append(ev)
        self._put(ev)

    def _end(self, failure: Failure | None = None) -> None:
        if self.done.is_set():
            return
        self.failure = failure
        self.done.set()
        self._put(_END)
        if self.on_end is not None:
            try:
                self.on_end(failure)
            except Exception:  # noqa: BLE001 (the request has ended either way)
                log.exception("request %d: on_end failed", self.rid)


class RemoteTicket(Ticket):
    """A request in the engine's process: iterate it for its events, as a `scheduler.Ticket`."""

    def __init__(self, conn: "Connection", rid: int, params, callbacks: list, should_stop) -> None:
        super().__init__(rid, None, callbacks, should_stop)
        self.conn = conn  # the process it runs in: it ends with that process
        self.params = params  # a live callable, or None
        self._sent_params = None
        self._stopping = False

    def cancel(self) -> None:
        """Stop this request: it leaves the batch before its next round there."""
        if not self._cancelled and not self.done.is_set():
            self._cancelled = True
            self.conn.post(("cancel", self.rid))

    # -- the delivery thread -----------------------------------------------------------------------
    def _arrive(self, ev: RoundEvent) -> None:
        """An event from the engine: this side's callbacks, the client's queue, then live params and Stop."""
        if self.done.is_set() or self._cancelled:
            return
        if not self._check(lambda: [cb(ev) for cb in self.callbacks], "callback", "on_round", ev.index):
            return
        self._deliver(ev)
        if ev.finished is not None:
            return
        if self.params is not None and not self._check(self._send_params, "params", "params", ev.index):
            return
        if self.should_stop is not None and not self._stopping:
            self._check(self._ask_stop, "callback", "should_stop", ev.index)

    def _send_params(self) -> None:
        now = self.params()
        if now != self._sent_params:
            self._sent_params = now
            self.conn.post(("params", self.rid, now))

    def _ask_stop(self) -> None:
        if self.should_stop():
            self._stopping = True
            self.conn.post(("stop", self.rid))

    def _check(self, fn: Callable[[], object], cause: str, step: str, index: int) -> bool:
        """Run one of this side's steps; an error ends the request as the scheduler would (`cause`, counted)."""
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001 (the scheduler's rule: it ends its own request only)
            self.conn.post(("cancel", self.rid))
            self.conn.count_failure(cause)
            self._end(Failure(cause, step, index, message_of(e)))
            return False
