"""The caller's side of the engine's process: the pipe, and a supervisor that replaces a process that ends.

A process that ends fails every request and call in flight with a message naming the signal or exit code; its
replacement gets the same load and scheduler arguments, calls wait for it up to the load timeout, and restarts
back off so that a model that cannot run does not spin the machine.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

from .failure import Failure, message_of
from .scheduler import SchedulerMetrics
from .ticket import RemoteTicket

log = logging.getLogger(__name__)

ENGINE_GONE = "the engine's process ended"
FIRST_DELAY = 0.5  # seconds before replacing a process that had been healthy
MAX_DELAY = 30.0  # the longest wait between two restarts
HEALTHY = 60.0  # a process that served this long resets the wait to FIRST_DELAY


def backoff(previous: float | None, healthy_for: float) -> float:
    """The next wait: FIRST_DELAY at first or after a healthy process, else doubled, at most MAX_DELAY."""
    if previous is None or healthy_for >= HEALTHY:
        return FIRST_DELAY
    return min(2 * previous, MAX_DELAY)


def _how(proc) -> str:  # how a process ended, for a person
    proc.join(5)  # the pipe closes as it dies; its exit status follows at once
    code = proc.exitcode
    if code is None:
        return "its pipe closed"
    return f"signal {-code}" if code < 0 else f"exit code {code}"


class Connection:
    """The pipe to one engine process: a reader thread for what comes back, a delivery thread for events.

    Args:
        on_lost: `(connection, how) -> message`, called on the reader thread when the process ends.
    """

    def __init__(self, conn, proc, on_lost: Callable[["Connection", str], str]) -> None:
        self.conn = conn
        self.proc = proc
        self.metrics: SchedulerMetrics | None = None
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tickets: dict[int, RemoteTicket] = {}
        self._calls: dict[int, Future] = {}
        self._gone: str | None = None  # the message once the process has ended
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="specdec-engine-reader", daemon=True)
        self._reader.start()
        threading.Thread(target=self._deliver, name="specdec-engine-delivery", daemon=True).start()

    def next_id(self) -> int:
        return next(self._ids)

    def post(self, msg) -> None:
        """Send without waiting for an answer (quietly nothing once the engine is gone)."""
        with self._lock:
            if self._gone:
                return
            try:
                self.conn.send(msg)
            except (OSError, EOFError, BrokenPipeError):
                pass

    def call(self, kind: str, *args, timeout: float | None = None):
        """Send a message that answers, and return its answer (or raise what the engine raised)."""
        return self.call_soon(kind, *args).result(timeout)

    def call_soon(self, kind: str, *args) -> Future:
        """Send a message that answers, without waiting: its Future (set on the reader thread)."""
        cid = self.next_id()
        fut: Future = Future()
        with self._lock:
            if self._gone:
                fut.set_exception(RuntimeError(self._gone))
                return fut
            self._calls[cid] = fut
            try:
                self.conn.send((kind, cid, *args))
            except (OSError, EOFError, BrokenPipeError):  # dying: the reader fails the call in a moment
                pass
        return fut

    def add(self, ticket: RemoteTicket) -> None:
        with self._lock:
            self._tickets[ticket.rid] = ticket

    def drop(self, rid: int) -> None:
        with self._lock:
            self._tickets.pop(rid, None)

    def count_failure(self, cause: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_failure(cause)

    def _read(self) -> None:
        """Answers are read here, events go to the delivery thread: a callback may wait for an answer."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "ret":
                with self._lock:
                    fut = self._calls.pop(msg[1], None)
                if fut is not None:
                    fut.set_result(msg[3]) if msg[2] else fut.set_exception(msg[3])
            elif kind == "metric":
                if self.metrics is not None:
                    getattr(self.metrics, msg[1])(msg[2])
            else:
                self._inbox.put(msg)
        self._lost()

    def _deliver(self) -> None:
        while True:
            msg = self._inbox.get()
            kind = msg[0]
            if kind == "ev":
                t = self._tickets.get(msg[1])
                if t is not None:
                    t._arrive(msg[2])
            elif kind == "end":
                with self._lock:
                    t = self._tickets.pop(msg[1], None)
                if t is not None:
                    t._end(msg[2])
            elif kind == "lost":
                self._fail_all(msg[1])
                return

    def _lost(self) -> None:
        """Fail calls now (a delivery callback may wait on one); requests fail after their events."""
        message = self._on_lost(self, _how(self.proc))
        with self._lock:
            self._gone = message
            calls = list(self._calls.values())
            self._calls.clear()
        for fut in calls:
            fut.set_exception(RuntimeError(message))
        self._inbox.put(("lost", message))

    def _fail_all(self, message: str) -> None:
        with self._lock:
            tickets = list(self._tickets.values())
            self._tickets.clear()
        if tickets:
            log.error("%s: failing %d requests", message, len(tickets))
        for t in tickets:
            t._end(Failure("error", "engine", len(t.events), message))

    @property
    def gone(self) -> bool:
        return self._gone is not None

    def close(self, timeout: float = 10.0) -> None:
        self.post(("close",))
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout)
        # Close the pipe after the reader ends: one in recv() could read a file that reuses the descriptor.
        self._reader.join(timeout)
        self.conn.close()


def launch(target: Callable, load_kwargs: dict, threads, timeout: float, started: Callable = lambda proc: None):
    """Spawn a process running `target(pipe, load_kwargs, threads)`; (pipe, process, its report) once loaded.

    Args:
        started: told the process at once, so that a caller can kill it while it loads.

    Raises:
        ValueError: the model `load` refused.
        RuntimeError: the process ended, or did not load within `timeout` s.
    """
    ctx = mp.get_context("spawn")  # a fork would copy this process's threads and OpenMP state
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(there, load_kwargs, threads), name="specdec-engine", daemon=True)
    proc.start()
    there.close()
    started(proc)
    ok = False
    try:
        if not here.poll(timeout):
            raise RuntimeError(f"the engine's process did not load the model within {timeout:.0f} s")
        try:
            msg = here.recv()
        except EOFError:
            raise RuntimeError(f"the engine's process ended while loading the model ({_how(proc)})") from None
        if msg[0] == "load_error":
            raise ValueError(msg[1])
        ok = True
        return here, proc, msg[1]
    finally:
        if not ok:
            proc.kill()
            proc.join(5)
            here.close()


class Supervisor:
    """Owns the engine's process: the connection to the live one, and its replacement when it dies.

    Args:
        timeout: seconds a process may take to load, and a call may wait for one.
    """

    def __init__(self, target: Callable, load_kwargs: dict, threads, timeout: float) -> None:
        self.target, self.load_kwargs, self.threads, self.timeout = target, load_kwargs, threads, timeout
        self.restarts = 0  # processes started to replace one that ended
        self.delays: list[float] = []  # the wait before each restart attempt, in order
        self._cond = threading.Condition()
        self._conn: Connection | None = None
        self._launching = None  # a process being started, killed by close()
        self._closed = False
        self._serving: tuple | None = None  # (metrics, fault_hook) once serve() was called
        self._started = 0.0
        self._delay: float | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> dict:
        """Start the first process (errors raise here); returns what it reported as it loaded."""
        here, proc, meta = launch(self.target, self.load_kwargs, self.threads, self.timeout)
        self._conn = Connection(here, proc, self._lost)
        self._started = time.monotonic()
        return meta

    @property
    def pid(self) -> int | None:  # None while the process is being replaced
        conn = self._conn
        return None if conn is None else conn.proc.pid

    def connection(self) -> Connection:
        """The live process's connection; while one is being replaced, waits for it (up to `timeout` s)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or self._conn is not None, self.timeout):
                raise RuntimeError(f"{ENGINE_GONE} and no new one loaded within {self.timeout:.0f} s")
            if self._closed:
                raise RuntimeError("the engine is closed")
            return self._conn

    def call(self, kind: str, *args):
        return self.connection().call(kind, *args)

    def call_soon(self, kind: str, *args) -> Future:
        """As `Connection.call_soon`, never waiting: while a process is being replaced, a failed Future."""
        conn = self._conn
        if conn is None:
            fut: Future = Future()
            fut.set_exception(RuntimeError(f"{ENGINE_GONE}; it is being restarted"))
            return fut
        return conn.call_soon(kind, *args)

    def serve(self, metrics: SchedulerMetrics | None, fault_hook) -> None:
        """Start the scheduler there, and in every process that replaces it, with these arguments."""
        conn = self.connection()
        conn.metrics = metrics
        conn.call("serve", fault_hook, metrics is not None)
        self._serving = (metrics, fault_hook)

    # -- replacing a process that ended -------------------------------------------------------------
    def _lost(self, conn: Connection, how: str) -> str:
        """On the dead connection's reader thread: start the replacement, and say so in the message."""
        with self._cond:
            if self._closed or conn is not self._conn:
                return f"{ENGINE_GONE} ({how})"
            self._conn = None
            self._delay = backoff(self._delay, time.monotonic() - self._started)
            self._thread = threading.Thread(target=self._replace, args=(conn, self._delay),
                                            name="specdec-engine-supervisor", daemon=True)
            self._thread.start()
        log.error("%s (%s): starting a new one in %.1f s", ENGINE_GONE, how, self._delay)
        return f"{ENGINE_GONE} ({how}); it is being restarted"

    def _replace(self, dead: Connection, delay: float) -> None:  # on its own thread, until a process serves
        dead.close(5.0)  # its reader has ended (it called _lost); this reaps the process and closes the pipe
        while True:
            self.delays.append(delay)
            with self._cond:
                if self._cond.wait_for(lambda: self._closed, delay):
                    return
            try:
                conn = self._launch()
            except Exception as e:  # noqa: BLE001 (a process that fails to start is retried, later)
                self._delay = delay = backoff(delay, 0.0)
                log.error("the engine's new process failed (%s): trying again in %.1f s", message_of(e), delay)
                continue
            with self._cond:
                if self._closed:
                    conn.close(5.0)
                    return
                self._conn, self._started = conn, time.monotonic()
                self.restarts += 1
                self._cond.notify_all()
            # A plain SchedulerMetrics does not count restarts; specdec.metrics.Metrics does.
            observe = getattr(self._serving[0] if self._serving else None, "observe_restart", None)
            if observe is not None:
                observe()
            log.warning("the engine's process was replaced (pid %d)", conn.proc.pid)
            return

    def _launch(self) -> Connection:
        """A new process, its scheduler started as the first one's was."""
        def started(proc) -> None:  # close() kills a process still loading (a load may take minutes)
            with self._cond:
                self._launching = proc
                if self._closed:
                    proc.kill()

        try:
            here, proc, _ = launch(self.target, self.load_kwargs, self.threads, self.timeout, started)
        finally:
            with self._cond:
                self._launching = None
        conn = Connection(here, proc, self._lost)
        try:
            if self._serving is not None:
                conn.metrics, fault_hook = self._serving
                conn.call("serve", fault_hook, conn.metrics is not None, timeout=self.timeout)
        except BaseException:
            conn.close(5.0)
            raise
        return conn

    def close(self, timeout: float = 10.0) -> None:
        """End the live process (or the one being started) and the supervision; calls waiting are refused."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            conn, launching, thread = self._conn, self._launching, self._thread
            self._cond.notify_all()
        if launching is not None:
            launching.kill()
        if conn is not None:
            conn.close(timeout)
        if thread is not None:
            thread.join(timeout)
