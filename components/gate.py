"""The app's one way to the model: the engine's narrow face, one target forward at a time.

Every target forward the app starts (each round of a generation or a race, each sampler-view
forward) runs under `lock`, so a sampler view interleaves between two rounds and never runs
during one. Through here the UI sees only plain values: `info()`, round events, sampler rows.
"""
from __future__ import annotations

import threading
import time

from specdec import Engine, GenerationRequest, RoundEvent, SamplingParams

from .updates import user_error


class ModelGate:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.info = engine.info()  # plain values: model, size, device, context, tree presets, heads, cache
        self.lock = threading.Lock()

    def stream(self, request: GenerationRequest, **callbacks):
        """`engine.stream(request)`: the request is checked against the model now (a refusal is a toast);
        its rounds run on `step`."""
        try:
            return self.engine.stream(request, **callbacks)
        except ValueError as e:
            raise user_error(e) from None

    def step(self, stream) -> tuple[RoundEvent | None, float]:
        """One round of a stream under the lock -> (event or None at the end, seconds)."""
        with self.lock:
            t0 = time.perf_counter()
            try:
                ev = next(stream, None)
            except ValueError as e:  # a request the engine refuses once it starts
                raise user_error(e) from None
            return ev, time.perf_counter() - t0

    def close(self, stream) -> None:
        with self.lock:
            stream.close()  # frees the KV cache (also when Gradio closes us: Stop, disconnect)

    def sampler_rows(self, ids: list[int], params: SamplingParams, top: int) -> list[dict]:
        """The sampler view's rows after `ids`: one small forward, under the lock."""
        ctx = self.info["context"]
        ids = ids[-(ctx - 1):] if ctx else ids  # the sampler view only needs the most recent context
        with self.lock:
            return self.engine.sampler_rows(ids, params, top)

    def prefix_cache(self) -> dict | None:
        """The prefix cache's budget, fill and hit ratio now (None: no cache)."""
        return self.engine.info()["prefix_cache"]

    def token_text(self, token_id: int) -> str:
        return self.engine.token_text(token_id)

    @property
    def device_name(self) -> str:
        kind = self.info["device_type"]
        return {"cpu": "CPU", "cuda": "GPU"}.get(kind, kind)
