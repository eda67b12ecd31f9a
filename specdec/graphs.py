"""CUDA-graph capture and replay of the target forward and the draft heads (opt-in, CUDA by default).

On a GPU a small model's eager forward is bound by kernel launches, not arithmetic: on an H200 in
bf16, a Qwen2-0.5B-shaped forward takes 16–22 ms eagerly whether it carries 1 token or 256, and
3.4–5 ms as a graph replay (REFERENCE.md). A graph fixes every address and shape, so here:
- the KV buffer is pooled: one SlotCache per capacity bucket, lent to one request at a time
  (`Graphs.cache`); a request that finds its bucket lent out gets its own buffer and runs eagerly;
- a round of N nodes runs in the graph of the next token bucket (1, 2, 4, ... 128): a padding
  query sees only its own slot and no real query sees it, so the real rows are the eager ones;
- a round's inputs (ids, positions, write slots, the tree's ancestor rows) reach the device in
  one host-to-device copy into a static buffer; the 4D mask is built inside the graph from them,
  and every layer writes its keys and values through a device index (`SlotCache.write_index`);
- a (capacity, bucket) pair is captured the first time it is used, after two warm-up runs.
When capture fails (an op that syncs with the host, say), that pair runs eagerly from then on and
one log line says why; nothing crashes and nothing changes the output.

On a CPU there is nothing to capture, but the same code runs under `RecordedReplay`, which
replays by re-running the captured function with the Python state it saw at capture time: a value
that a real graph would bake in (the cache's length, a slice bound) then gives a wrong answer in
the CPU tests too, which is how they catch it.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Callable

import torch

from . import kv_cache

log = logging.getLogger(__name__)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # a round of N nodes replays the graph of the next bucket
CAPACITY_STEP = 256  # pooled buffers come in multiples of this many slots


def token_bucket(n: int) -> int | None:
    """The smallest bucket holding n tokens, or None (run eagerly) when n is beyond the largest."""
    return next((b for b in TOKEN_BUCKETS if b >= n), None)


class CudaReplay:
    """fn captured as one torch.cuda.CUDAGraph (after warm-up on a side stream); calling it replays.

    Each graph has its own memory pool: a failed capture then cannot leave a shared pool marked as
    recording, which would make every later capture fail too.
    """

    def __init__(self, fn: Callable[[], torch.Tensor], warmup: int = 2) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")  # a host sync in fn raises here, before any capture begins
        try:
            with torch.cuda.stream(side):  # cuBLAS and allocator set-up happen outside the capture
                for _ in range(warmup):
                    fn()
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # "thread_local": another thread's CUDA work during the capture does not invalidate it.
        capture = torch.cuda.graph(self.graph, capture_error_mode="thread_local")
        capture.__enter__()
        done = False
        try:
            self.out = fn()
            capture.__exit__(None, None, None)
            done = True
        finally:
            if not done:
                _abandon(capture, self.graph)

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


def _abandon(capture, graph) -> None:
    """Close a capture that failed, so that the next one can begin.

    torch's own exit stops at the first error: after an invalidated capture, `capture_end` raises
    before the stream is restored and before the allocator stops routing to the graph's pool.
    """
    for step in (graph.capture_end, lambda: capture.stream_ctx.__exit__(None, None, None),
                 lambda: torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), graph.pool())):
        try:
            step()
        except (RuntimeError, AttributeError):
            pass  # already done, or not begun


class RecordedReplay:
    """The CPU stand-in for CudaReplay: re-runs fn with `state`'s Python attributes as they were at capture."""

    def __init__(self, fn: Callable[[], torch.Tensor], state: object | None = None,
                 attrs: tuple[str, ...] = ("length", "write_index")) -> None:
        self.fn, self.state = fn, state
        self.saved = {a: getattr(state, a) for a in attrs} if state is not None else {}
        self.out = fn()

    def __call__(self) -> torch.Tensor:
        now = {a: getattr(self.state, a) for a in self.saved}
        for a, v in self.saved.items():
            setattr(self.state, a, v)
        try:
            self.out = self.fn()
        finally:
            for a, v in now.items():
                setattr(self.state, a, v)
        return self.out


class _Forward:
    """One captured target forward: Tb query tokens over a pooled buffer of `capacity` slots."""

    def __init__(self, graphs: "Graphs", core: kv_cache.SlotCache, tokens: int) -> None:
        target, dev = graphs.target, graphs.target.device
        Tb, C = tokens, core.capacity
        # Rows: ids, positions, write slots, then Tb rows of the ancestor mask (0/1). [3 + Tb, Tb]
        self.stage = torch.zeros(3 + Tb, Tb, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.io = torch.zeros(3 + Tb, Tb, dtype=torch.long, device=dev)
        # The copy from `stage` is asynchronous: the next round must not rewrite `stage` before it is done.
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.tokens = Tb
        key_slot = torch.arange(C, device=dev)  # [C]
        neg = torch.finfo(target.dtype).min
        zero = torch.zeros((), dtype=target.dtype, device=dev)

        def forward() -> torch.Tensor:
            ids, pos, slots = self.io[0], self.io[1], self.io[2]  # [Tb] each
            seen = (key_slot < slots[:1]).expand(Tb, C).contiguous()  # [Tb, C] the committed slots
            seen.scatter_(1, slots.expand(Tb, Tb), self.io[3:].bool())  # plus each query's ancestors
            mask = torch.where(seen, zero, neg)[None, None]  # [1, 1, Tb, C]
            core.write_index = slots
            try:
                out = target.base(input_ids=ids[None], position_ids=pos[None], attention_mask=mask,
                                  past_key_values=core, use_cache=True)
            finally:
                core.write_index = None
            return out.last_hidden_state[0]  # [Tb, H]

        self.forward, self.core, self.capture = forward, core, graphs.capture
        self.replay = None  # captured on the first call, once the inputs hold a real round: the warm-up
        # runs write the buffer at the slots the inputs name, and zeros would overwrite committed slot 0

    def __call__(self, ids: torch.Tensor, past: int, tree_mask: torch.Tensor | None,
                 depth: torch.Tensor | None) -> torch.Tensor:
        """ids [T] after `past` committed tokens; tree_mask [T, T] bool and depth [T] (None: a causal chain)."""
        T, Tb, s = ids.shape[0], self.tokens, self.stage
        if self.copied is not None:
            self.copied.synchronize()  # the previous round's copy has long finished: the host synced since
        s.zero_()
        s[0, :T] = ids
        s[0, T:] = ids[0]  # padding: any real token id
        s[1, :] = past
        if depth is not None:
            s[1, :T] += depth
        else:
            s[1, :T] += torch.arange(T)
        s[2] = torch.arange(past, past + Tb)
        body = s[3:]  # [Tb, Tb]
        if tree_mask is not None:
            body[:T, :T] = tree_mask
        else:
            body[:T, :T] = torch.ones(T, T, dtype=torch.long).tril_()
        body[T:, T:] = torch.eye(Tb - T, dtype=torch.long)  # a padding query sees only its own slot
        self.io.copy_(s, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        if self.replay is None:
            self.replay = self.capture(self.forward, self.core)
        return self.replay()[:T].clone()  # the static output is overwritten by the next replay


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
        self._cores: dict[int, kv_cache.SlotCache] = {}  # capacity -> the pooled buffer
        self._lent: dict[int, weakref.ref] = {}  # capacity -> the request's cache over it
        self._forwards: dict[tuple[int, int], _Forward | None] = {}  # (capacity, bucket); None: runs eagerly
        self._heads: dict[tuple[int, int], tuple[object, torch.Tensor, Callable] | None] = {}  # (id(heads), k)
        self.failures: dict[str, str] = {}  # what fell back to eager, and why

    def info(self) -> dict:
        """Plain values: how it captures, what it has captured, and what fell back to eager (and why)."""
        with self._lock:
            return {"mode": self.mode,
                    "forwards": sorted(f"{b} tokens / {c} slots" for (c, b), g in self._forwards.items()
                                       if g is not None and g.replay is not None),
                    "heads": sorted(k for (_, k), entry in self._heads.items() if entry is not None),
                    "failures": dict(self.failures)}

    def capture(self, fn: Callable[[], torch.Tensor], state: object | None = None):
        return CudaReplay(fn) if self.mode == "cuda" else RecordedReplay(fn, state)

    # -- the pooled KV buffers ---------------------------------------------------------
    def capacity(self, slots: int) -> int:
        """The pooled capacity for a request that needs `slots` (prompt + new tokens + its largest round)."""
        return kv_cache.bucket(slots, CAPACITY_STEP)

    @torch.inference_mode()
    def cache(self, slots: int) -> kv_cache.SlotCache | None:
        """An empty cache over the pooled buffer for `slots`, lent until it is released or dropped; None if lent out."""
        C = self.capacity(slots)
        with self._lock:
            held = self._lent.get(C)
            if held is not None and held() is not None:
                return None
            core = self._cores.get(C)
            if core is None:
                core = self._cores[C] = self._allocate(C)
                self._capture_all(C)
            lent = core.sharing()
            self._lent[C] = weakref.ref(lent)
            return lent

    def _capture_all(self, capacity: int) -> None:
        """Capture every bucket of a new buffer now, while it is empty: a capture's warm-up runs write
        slots [0, bucket), which would overwrite committed tokens later, and a capture inside a
        request's round would count against its time."""
        core, dev = self._cores[capacity], self.target.device
        for Tb in TOKEN_BUCKETS:
            if Tb > capacity:
                break
            graph = self._forwards[(capacity, Tb)] = _Forward(self, core, Tb)
            if self._try(f"forward of {Tb} tokens over {capacity} slots",
                         lambda: graph(torch.zeros(Tb, dtype=torch.long), 0, None, None)) is None:
                self._forwards[(capacity, Tb)] = None

    @torch.inference_mode()
    def release(self, cache, failed: bool = False) -> None:
        """The request is done with its pooled cache (a cache that is not pooled is ignored).

        failed: the request ended in an error, so its slots may hold NaN or inf; they are zeroed,
        since a masked score is still NaN (NaN + min) and would spread to the next request.
        """
        with self._lock:
            for C, ref in list(self._lent.items()):
                if ref() is cache:
                    del self._lent[C]
                    if failed:
                        for layer in self._cores[C].layers:
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
                         past_key_values=core, use_cache=True)
        core.write_index = None
        return core

    def owns(self, cache) -> bool:
        """Is `cache` a pooled buffer lent out now (its rounds replay graphs)?"""
        return self._capacity_of(cache) is not None

    def _capacity_of(self, cache) -> int | None:
        ref = self._lent.get(getattr(cache, "capacity", -1))
        return cache.capacity if ref is not None and ref() is cache else None

    # -- forwards ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                depth: torch.Tensor | None = None) -> torch.Tensor | None:
        """A round's forward through its bucket's graph -> hidden [T, H]; None where it must run eagerly.

        Eager cases: the cache is not a pooled one, T is beyond the largest bucket, the round would
        not fit the buffer, a sliding window is in reach (its mask is not built here), or capture failed.
        """
        C = self._capacity_of(cache)
        T = ids.shape[0]
        Tb = token_bucket(T)
        if C is None or Tb is None or cache.length + Tb > C:
            return None
        target = self.target
        if target.window_mode in ("uniform", "mapping"):
            reach = cache.length + (int(depth.max()) if depth is not None else T - 1)
            if reach >= target.window:
                return None
        with self._lock:
            key = (C, Tb)
            if key not in self._forwards:
                self._forwards[key] = _Forward(self, self._cores[C], Tb)
            graph = self._forwards[key]
            if graph is None:
                return None
            if graph.replay is None:  # the first call captures: it may fail, and then this key runs eagerly
                hidden = self._try(f"forward of {Tb} tokens over {C} slots",
                                   lambda: graph(ids, cache.length, tree_mask, depth))
                if hidden is None:
                    self._forwards[key] = None
                    return None
            else:
                hidden = graph(ids, cache.length, tree_mask, depth)
        kv_cache.advance(cache, T)
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
        K = heads.config.num_heads
        return heads, h, self.capture(lambda: heads(h) if k >= K else heads.first(h, k))

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
