"""The app's one way to the model: the scheduler that owns it, through the engine's narrow face.

Generate streams go through `Scheduler.submit`: concurrent users are decoded together, each
request's events arrive on its own queue, and closing a stream (Stop, a closed tab) frees its slot
by the next round. Compare's lanes and the sampler view run on the scheduler's thread between two
rounds (`Scheduler.call`): a race times the engine alone, and a sampler-view forward never runs
during a round. Through here the UI sees only plain values: `info()`, round events, sampler rows.
"""
from __future__ import annotations

import time

import gradio as gr

from specdec import Engine, GenerationRequest, RequestFailed, RoundEvent, SamplingParams, Scheduler
from specdec.engine_process import RemoteModel

from .updates import user_error


class _Solo:
    """A race lane: the engine's own stream, each round run on the scheduler's thread."""

    def __init__(self, stream) -> None:
        self.stream = stream


class ModelGate:
    def __init__(self, engine: Engine, scheduler: Scheduler | None = None) -> None:
        self.engine = engine
        self.scheduler = scheduler or Scheduler(engine, max_batch_size=1)
        self.info = engine.info()  # plain values: model, size, device, context, tree presets, heads, cache

    def stream(self, request: GenerationRequest, solo: bool = False, **callbacks):
        """A request's event stream: batched with other users' requests, or (`solo`, for a race) alone.

        The request is checked against the model now (a refusal is a toast); its rounds come from `step`.
        """
        try:
            if solo:
                return _Solo(self.engine.stream(request, **callbacks))
            return iter(self.scheduler.submit(request, **callbacks))
        except ValueError as e:
            raise user_error(e) from None

    def step(self, stream) -> tuple[RoundEvent | None, float]:
        """The stream's next round -> (event or None at the end, seconds).

        For a batched stream the seconds are the wait for the event; for a race lane, the round's own time.
        """
        t0 = time.perf_counter()
        try:
            if isinstance(stream, _Solo):
                return self.scheduler.call(self._timed_next, stream.stream)
            return next(stream, None), time.perf_counter() - t0
        except (ValueError, RequestFailed) as e:  # a request refused once it starts, or ended by a fault
            raise user_error(e) from None

    @staticmethod
    def _timed_next(stream) -> tuple[RoundEvent | None, float]:
        t0 = time.perf_counter()
        ev = next(stream, None)
        return ev, time.perf_counter() - t0

    def close(self, stream) -> None:
        """End a stream early: a batched request leaves the batch by the next round; a race lane frees its cache."""
        if isinstance(stream, _Solo):
            self.scheduler.call(stream.stream.close)
        else:
            stream.close()

    def sampler_rows(self, ids: list[int], params: SamplingParams, top: int) -> list[dict]:
        """The sampler view's rows after `ids`: one small forward, between two rounds."""
        ctx = self.info["context"]
        ids = ids[-(ctx - 1):] if ctx else ids  # the sampler view only needs the most recent context
        return self.scheduler.call(self.engine.sampler_rows, ids, params, top)

    def prefix_cache(self) -> dict | None:
        """The prefix cache's budget, fill and hit ratio now (None: no cache)."""
        return self.engine.info()["prefix_cache"]

    def token_text(self, token_id: int) -> str:
        return self.engine.token_text(token_id)

    @property
    def device_name(self) -> str:
        kind = self.info["device_type"]
        return {"cpu": "CPU", "cuda": "GPU"}.get(kind, kind)


class RemoteGate(ModelGate):
    """The same gate over a model served by its own process (`specdec.engine_process`): there the scheduler's
    thread already runs every call between two rounds, so a race lane's round and the sampler view's forward
    are messages, and a lane's seconds are its round's own time there, not the message's."""

    def __init__(self, loaded: RemoteModel) -> None:
        self.engine = loaded.engine
        self.scheduler = loaded.scheduler
        self.info = loaded.engine._info  # plain values, as the engine's process reported them at load

    def step(self, stream) -> tuple[RoundEvent | None, float]:
        if not isinstance(stream, _Solo):
            return super().step(stream)
        try:
            return stream.stream.timed_next()
        except (ValueError, RequestFailed) as e:
            raise user_error(e) from None
        except RuntimeError as e:  # the engine's process died mid-call: a toast, and the app serves on
            raise engine_error(e) from None

    def close(self, stream) -> None:
        if isinstance(stream, _Solo):
            stream.stream.close()
        else:
            stream.close()

    def sampler_rows(self, ids: list[int], params: SamplingParams, top: int) -> list[dict]:
        ctx = self.info["context"]
        ids = ids[-(ctx - 1):] if ctx else ids
        try:
            return self.engine.sampler_rows(ids, params, top)
        except RuntimeError as e:  # the engine's process died mid-call: a toast, and the app serves on
            raise engine_error(e) from None

    def prefix_cache(self) -> dict | None:
        """The prefix cache as last heard from the engine's process (the metrics' gauges lag by a request)."""
        return self.engine.prefix_cache_state()


def engine_error(e: RuntimeError) -> gr.Error:
    """The engine's process ended (or the engine closed) under a call: say so, without a traceback."""
    return gr.Error(str(e), title="The model's process restarted", print_exception=False)


def open_gate(loaded) -> ModelGate:
    """The gate for a model loaded here (`specdec.load`) or served by its own process (`engine_process.start`)."""
    if isinstance(loaded, RemoteModel):
        return RemoteGate(loaded)
    return ModelGate(loaded.engine, loaded.scheduler)
