"""CUDA-graph capture and replay of the target forward and the draft heads (opt-in, CUDA by default).

A small model's eager GPU forward is bound by kernel launches, which a replay removes. A graph fixes every
address and shape, so KV buffers are pooled (POOL_SIZE per capacity, each lent to one request; one finding
none free runs eagerly), and a round replays the graph of its token bucket (a batch: of its row bucket too)
with padding masked both ways. A failed capture runs that shape eagerly from then on. On a CPU,
`RecordedReplay` reruns with the Python state seen at capture, so tests catch values a graph would bake in.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Callable

import torch

from . import kv_cache
from .captured import CudaReplay, Forward, RecordedReplay

log = logging.getLogger(__name__)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # a round of N nodes replays the graph of the next bucket
CAPACITY_STEP = 256  # pooled buffers come in multiples of this many slots
POOL_SIZE = 2  # pooled buffers per capacity: requests streamed side by side that all replay graphs
# What a forward's Python reads from its cache, frozen at capture by the CPU stand-in.
_STATE = {kv_cache.SlotCache: ("length", "write_index"), kv_cache.BatchCache: ("lo", "starts", "width", "write_index")}


def token_bucket(n: int) -> int | None:
    """The smallest bucket holding n tokens, or None (run eagerly) when n is beyond the largest."""
    return next((b for b in TOKEN_BUCKETS if b >= n), None)


def row_bucket(n: int, rows: int) -> int:
    """Rows a batched round of n requests runs over in a buffer of `rows`: the next power of two, or all."""
    b = 1
    while b < n:
        b *= 2
    return min(b, rows)


class Graphs:
    """Captured forwards for one TargetModel (and its heads), with the pooled KV buffers they write."""

    def __init__(self, target, capture: str = "cuda") -> None:
        """Args:
            capture: "cuda" (torch.cuda graphs) or "recorded" (the CPU stand-in, for tests).
        """
        if capture not in ("cuda", "recorded"):
            raise ValueError(f"`capture` must be 'cuda' or 'recorded', got {capture!r}")
        if capture == "cuda" and target.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, but the model is on {target.device}")
        self.target = target
        self.mode = capture
        self._lock = threading.RLock()  # one replay at a time: each graph has one set of static inputs
        self._cores: dict[tuple[int, int], kv_cache.SlotCache] = {}  # (capacity, j) -> a pooled buffer
        self._lent: dict[tuple[int, int], weakref.ref] = {}  # (capacity, j) -> the request's cache over it
        self._forwards: dict[tuple, Forward | None] = {}  # (capacity, j, bucket); None: runs eagerly
        # Batches' buffers with graphs, kept on each buffer so a graph neither keeps it alive nor outlives it.
        self._batched: weakref.WeakSet = weakref.WeakSet()
        self._heads: dict[tuple[int, int], tuple[object, torch.Tensor, Callable] | None] = {}  # (id(heads), k)
        self.failures: dict[str, str] = {}  # what fell back to eager, and why

    def info(self) -> dict:
        """Plain values: how it captures, what it has captured, and what fell back to eager (and why)."""
        with self._lock:
            return {"mode": self.mode,
                    "forwards": sorted({f"{b} tokens / {c} slots" for (c, _, b), g in self._forwards.items()
                                        if g is not None and g.replay is not None}),
                    "batched": sorted({f"{r} rows x {b} tokens / {c} slots" for cache in list(self._batched)
                                       for (c, r, b), g in cache.graphs.items() if g is not None and g.replay is not None}),
                    "heads": sorted(k for (_, k), entry in self._heads.items() if entry is not None),
                    "failures": dict(self.failures)}

    def capture(self, fn: Callable[[], torch.Tensor], state: object | None = None):
        if self.mode == "cuda":
            return CudaReplay(fn)
        return RecordedReplay(fn, state, _STATE[type(state)] if state is not None else ())

    # -- the pooled KV buffers ---------------------------------------------------------
    @torch.inference_mode()
    def cache(self, slots: int) -> kv_cache.SlotCache | None:
        """An empty cache over a pooled buffer for `slots`, lent until released or dropped; None if all are lent."""
        C = kv_cache.bucket(slots, CAPACITY_STEP)  # slots: prompt + new tokens + room for the largest round
        with self._lock:
            key = next(((C, j) for j in range(POOL_SIZE) if self._lent.get((C, j)) is None
                        or self._lent[(C, j)]() is None), None)
            if key is None:
                return None
            core = self._cores.get(key)
            if core is None:
                core = self._cores[key] = self._allocate(C)
                self._capture_all(key)
            lent = core.sharing()
            self._lent[key] = weakref.ref(lent)
            return lent

    def _capture_all(self, pooled: tuple[int, int]) -> None:
        """Capture every bucket of a new buffer while it is empty, since warm-up runs write slots [0, bucket)."""
        core, C = self._cores[pooled], pooled[0]
        for Tb in TOKEN_BUCKETS:
            if Tb > C:
                break
            graph = self._forwards[pooled + (Tb,)] = Forward(self.target, core, 1, Tb, self.capture)
            if self._try(f"forward of {Tb} tokens over {C} slots",
                         lambda: graph([(torch.zeros(Tb, dtype=torch.long), 0, None, None)])) is None:
                self._forwards[pooled + (Tb,)] = None

    @torch.inference_mode()
    def release(self, cache, failed: bool = False) -> None:
        """The request is done with its pooled cache (a cache that is not pooled is ignored).

        Args:
            failed: the request ended in an error; its slots are zeroed, since NaN + min would spread NaN.
        """
        with self._lock:
            for key, ref in list(self._lent.items()):
                if ref() is cache:
                    del self._lent[key]
                    if failed:
                        for layer in self._cores[key].layers:
                            layer.keys.zero_()
                            layer.values.zero_()

    def _allocate(self, capacity: int) -> kv_cache.SlotCache:
        """A pooled buffer, its tensors made by one throwaway token (the layers size themselves from it)."""
        core = kv_cache.SlotCache(self.target.model.config.get_text_config(decoder=True).num_hidden_layers,
                                  capacity, fixed_shapes=True)
        dev = self.target.device
        core.write_index = torch.zeros(1, dtype=torch.long, device=dev)
        mask = torch.full((1, 1, 1, capacity), torch.finfo(self.target.dtype).min, dtype=self.target.dtype,
                          device=dev)
        mask[..., 0] = 0
        self.target.base(input_ids=torch.zeros(1, 1, dtype=torch.long, device=dev),
                         position_ids=torch.zeros(1, 1, dtype=torch.long, device=dev), attention_mask=mask,
                         use_cache=True, **{self.target.cache_arg: core})
        core.write_index = None
        return core

    def owns(self, cache) -> bool:
        """Is `cache` a pooled buffer lent out now (its rounds replay graphs)?"""
        return self._pooled(cache) is not None

    def _pooled(self, cache) -> tuple[int, int] | None:
        """The (capacity, j) of the pooled buffer `cache` holds now, or None."""
        C = getattr(cache, "capacity", -1)
        return next(((C, j) for j in range(POOL_SIZE) if (ref := self._lent.get((C, j))) is not None
                     and ref() is cache), None)

    # -- forwards ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                depth: torch.Tensor | None = None) -> torch.Tensor | None:
        """A round's forward through its bucket's graph -> hidden [T, H]; None where it must run eagerly.

        A round in reach of a sliding window runs eagerly, since the graph's mask has no window.
        """
        pooled = self._pooled(cache)
        T = ids.shape[0]
        Tb = token_bucket(T)
        if pooled is None or Tb is None or cache.length + Tb > pooled[0]:
            return None
        C = pooled[0]
        target = self.target
        if target.window_mode in ("uniform", "mapping"):
            reach = cache.length + (int(depth.max()) if depth is not None else T - 1)
            if reach >= target.window:
                return None
        with self._lock:
            key = pooled + (Tb,)
            if key not in self._forwards:
                self._forwards[key] = Forward(self.target, self._cores[pooled], 1, Tb, self.capture)
            hidden = self._run(self._forwards, key, f"forward of {Tb} tokens over {C} slots",
                               [(ids, cache.length, tree_mask, depth)])
        if hidden is None:
            return None
        kv_cache.advance(cache, T)
        return hidden[0]

    @torch.inference_mode()
    def forward_rows(self, cache: kv_cache.BatchCache, lo: int, tokens: list[list[int]],
                     trees: list) -> torch.Tensor | None:
        """A batched round through its (rows, bucket) graph -> [b, T, H]; None where it runs eagerly.

        Only rounds from row 0 replay, so a request retried alone in its row runs eagerly.
        """
        b, T = len(tokens), max(len(t) for t in tokens)
        Tb, starts = token_bucket(T), cache.lengths[:b]
        if lo != 0 or Tb is None or max(starts) + Tb > cache.capacity or b > cache.rows or not cache.allocated:
            return None
        rows = []
        for toks, tree, past in zip(tokens, trees, starts):
            depth = tree[1] if tree is not None else None
            rows.append((torch.tensor(toks), past, tree[0] if tree is not None else None, depth))
        target = self.target
        if target.window_mode in ("uniform", "mapping"):
            reach = max(p + (int(d.max()) if d is not None else len(t) - 1) for t, p, _, d in rows)
            if reach >= target.window:
                return None
        B, C = row_bucket(b, cache.rows), cache.capacity
        with self._lock:
            graphs = cache.graphs
            self._batched.add(cache)
            for stale in [k for k in graphs if k[0] != C]:  # the buffer grew: new tensors, new graphs
                del graphs[stale]
            key = (C, B, Tb)
            if key not in graphs:
                graphs[key] = Forward(target, cache, B, Tb, self.capture)
            return self._run(graphs, key, f"batched forward of {B} rows x {Tb} tokens over {C} slots", rows)

    def _run(self, graphs: dict, key, what: str, rows) -> torch.Tensor | None:
        """Replay graphs[key] on these rows, capturing it first if it never ran (a failure: eager from now on)."""
        graph = graphs[key]
        if graph is None:
            return None
        if graph.replay is not None:
            return graph(rows)
        hidden = self._try(what, lambda: graph(rows))
        if hidden is None:
            graphs[key] = None
        return hidden

    @torch.inference_mode()
    def heads(self, heads, hidden: torch.Tensor, k: int) -> torch.Tensor | None:
        """The first k heads' logits for hidden [H] through a graph -> [k, V]; None where they run eagerly."""
        if not getattr(heads, "graph_safe", False):  # e.g. the bench's oracle, which looks things up on the host
            return None
        key = (id(heads), k)
        with self._lock:
            if key not in self._heads:
                self._heads[key] = self._try(f"{k} draft heads", lambda: self._capture_heads(heads, hidden, k))
            entry = self._heads[key]
            if entry is None:
                return None
            owner, h, replay = entry  # the entry holds its heads, so their id cannot be reused meanwhile
            h.copy_(hidden)
            return replay().clone()

    def _capture_heads(self, heads, hidden: torch.Tensor, k: int):
        h = hidden.detach().clone()  # [H] static input
        return heads, h, self.capture(lambda: heads(h) if k >= heads.config.num_heads else heads.first(h, k))

    def _try(self, what: str, build: Callable):
        try:
            return build()
        except Exception as e:  # noqa: BLE001 (any capture failure means: run this one eagerly)
            why = f"{type(e).__name__}: {e}"
            self.failures[what] = why
            log.warning("CUDA graph capture of the %s failed (%s); running it eagerly", what, why)
            if self.mode == "cuda":
                try:
                    torch.cuda.synchronize()
                except RuntimeError:
                    pass
            return None
