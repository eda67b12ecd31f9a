"""The model in its own process, so a server's Python does not share a GIL with the rounds.

`start(...)` returns a `RemoteModel` with `Loaded`'s faces; callbacks run here as each event arrives. Live
`params` and `should_stop` are read here after each event, so they land a round later than in-process, yet
every round runs under one whole `SamplingParams` and stays exact. A process that ends fails the requests in
flight and is replaced (`specdec.supervisor`).
"""
from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Callable, Iterator

import torch

from .engine import RoundEvent
from .request import GenerationRequest, as_request, callbacks_of
from .scheduler import SchedulerMetrics
from .engine_server import serve_engine
from .supervisor import Supervisor
from .ticket import RemoteTicket

log = logging.getLogger(__name__)


class RemoteScheduler:
    """The engine process's scheduler, with `Scheduler`'s face for submitting requests."""

    def __init__(self, supervisor: Supervisor, max_batch_size: int) -> None:
        self._supervisor = supervisor
        self.max_batch_size = max_batch_size

    def submit(self, request, *fields, on_round=None, should_stop: Callable[[], bool] | None = None,
               **named) -> RemoteTicket:
        """Queue a request there (ValueError here if refused), waiting out a process's replacement."""
        request = as_request(request, fields, named)
        live = request.params if callable(request.params) else None
        if live is not None:  # sent as its value now; later values follow the events (RemoteTicket._arrive)
            request = dataclasses.replace(request, params=live())
        callbacks = callbacks_of(on_round)
        for attempt in (1, 2):
            conn = self._supervisor.connection()
            ticket = RemoteTicket(conn, conn.next_id(), live, callbacks, should_stop)
            ticket._sent_params = request.params
            conn.add(ticket)  # before the engine can send its first event
            try:
                conn.call("submit", ticket.rid, request, live is not None)
                return ticket
            except BaseException:
                conn.drop(ticket.rid)
                # A process that died before it took the request: nothing ran, so its replacement takes it.
                if not (conn.gone and attempt == 1):
                    raise

    def stream(self, request, *fields, on_round=None, should_stop=None, **named) -> Iterator[RoundEvent]:
        return iter(self.submit(request, *fields, on_round=on_round, should_stop=should_stop, **named))

    def stats(self) -> dict:
        return self._supervisor.call("stats")

    def close(self, timeout: float | None = 10.0) -> None:
        self._supervisor.close(timeout or 10.0)


class RemoteLane:
    """A request run alone in the engine's process (Compare's race), one round per `timed_next()`."""

    def __init__(self, supervisor: Supervisor, request: GenerationRequest,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self._conn = supervisor.connection()  # the lane's cache lives in that process: it ends with it
        self.lid = self._conn.next_id()
        self.should_stop = should_stop
        self._open = True
        self._conn.call("lane_open", self.lid, request)

    def timed_next(self) -> tuple[RoundEvent | None, float]:
        """The next round and its time there (run between two rounds of the batch), or (None, 0) at the end."""
        if not self._open:
            return None, 0.0
        if self.should_stop is not None and self.should_stop():
            self.close()
            return None, 0.0
        ev, secs = self._conn.call("lane_next", self.lid)
        if ev is None:
            self.close()
        return ev, secs

    def close(self) -> None:
        if self._open:
            self._open = False
            self._conn.post(("lane_close", self.lid))


class RemoteEngine:
    """What a server asks of the engine itself, answered by the engine's process."""

    def __init__(self, supervisor: Supervisor, tokenizer, info: dict) -> None:
        self._supervisor = supervisor
        self.tokenizer = tokenizer
        self._info = info
        self._text_memo: dict[int, str] = {}
        self._prefix_cache = info["prefix_cache"]
        self._asked: Future | None = None

    def info(self) -> dict:
        """As `Engine.info()`, read now (the prefix cache's fill changes)."""
        return self._supervisor.call("info")

    def prefix_cache_state(self) -> dict | None:
        """The prefix cache's state as last heard, refreshed for next time: its reader must not wait."""
        if self._asked is None or self._asked.done():
            self._asked = self._supervisor.call_soon("info")
            self._asked.add_done_callback(self._heard)
        return self._prefix_cache

    def _heard(self, fut: Future) -> None:
        if fut.exception() is None:
            self._prefix_cache = fut.result()["prefix_cache"]

    def token_text(self, token_id: int) -> str:  # as Engine.token_text, from the same tokenizer here
        text = self._text_memo.get(token_id)
        if text is None:
            text = self._text_memo[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def sampler_rows(self, prompt_ids, params, top: int = 20) -> list[dict]:
        """As `Engine.sampler_rows`, run there between two rounds."""
        return self._supervisor.call("sampler_rows", list(prompt_ids), params, top)

    def stream(self, request: GenerationRequest, should_stop: Callable[[], bool] | None = None) -> RemoteLane:
        """A lane run alone (ValueError here for a request the engine refuses)."""
        return RemoteLane(self._supervisor, request, should_stop)


@dataclasses.dataclass
class RemoteModel:
    """`Loaded`'s face for a model served by another process (`start`), replaced if it dies."""

    tokenizer: object
    name: str
    device: torch.device
    max_batch_size: int
    engine: RemoteEngine
    scheduler: RemoteScheduler
    threads: str  # what the engine's process chose for torch's threads, and why
    _supervisor: Supervisor = dataclasses.field(repr=False)
    serving: bool = False

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def pid(self) -> int | None:
        """The engine process's id now (None while a new one is being started)."""
        return self._supervisor.pid

    def serve(self, metrics: SchedulerMetrics | None = None, fault_hook=None) -> RemoteScheduler:
        """Start the scheduler there, and in any process that replaces it.

        Args:
            metrics: receives the scheduler's metrics, and restarts too if it has `observe_restart`.
            fault_hook: for tests; it must pickle.
        """
        if self.serving:
            raise RuntimeError("this model's scheduler is already running")
        self._supervisor.serve(metrics, fault_hook)
        self.serving = True
        return self.scheduler

    def close(self) -> None:
        self._supervisor.close()


def start(threads: int | str = "auto", timeout: float = 600.0, **load_kwargs) -> RemoteModel:
    """Load a model in a new process and return its face here (a model `load` refuses raises its ValueError).

    Args:
        threads: torch's intra-op threads there: a count, or "auto" (`threads.serving_threads`).
        timeout: seconds a process, the first or a replacement, may take to load.
        load_kwargs: as `specdec.load`, except that `prefix_cache` is a budget in bytes or None.
    """
    if threads != "auto" and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"`threads` must be 'auto' or an integer >= 1, got {threads!r}")
    supervisor = Supervisor(serve_engine, load_kwargs, threads, timeout)
    meta = supervisor.start()
    return RemoteModel(meta["tokenizer"], meta["name"], torch.device(meta["device"]), meta["max_batch_size"],
                       RemoteEngine(supervisor, meta["tokenizer"], meta["info"]),
                       RemoteScheduler(supervisor, meta["max_batch_size"]), meta["threads"], supervisor)


def wanted(mode: str, device: str | None) -> bool:
    """Whether to serve from an engine process.

    Args:
        mode: "on", "off", or "auto": on for a CPU (where Python and the rounds share one GIL), off on
            CUDA and under ZeroGPU, whose `spaces.GPU` needs the model in the handler's process.
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"`engine_process` must be 'auto', 'on' or 'off', got {mode!r}")
    if mode != "auto":
        return mode == "on"
    import importlib.util

    if importlib.util.find_spec("spaces") is not None:
        return False
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cpu"


def serving_model(mode: str, threads: int | str, prefix_cache: int | None, **load_kwargs) -> tuple[object, bool, str]:
    """A model for a server: in its own process where `wanted(mode, device)`, else loaded here.

    Args:
        prefix_cache: a budget in bytes, or None.

    Returns:
        (the model, whether it runs in its own process, a line saying how torch's threads were chosen).
    """
    if wanted(mode, load_kwargs.get("device")):
        remote = start(threads=threads, prefix_cache=prefix_cache, **load_kwargs)
        return remote, True, remote.threads
    import specdec  # the package's `load`, as a caller (or a test) sees it

    from .prefix_cache import PrefixCache
    from .threads import serving_threads

    loaded = specdec.load(prefix_cache=None if prefix_cache is None else PrefixCache(max_bytes=prefix_cache),
                          **load_kwargs)
    return loaded, False, serving_threads(loaded, threads)
