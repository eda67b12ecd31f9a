"""Captured callables over static inputs: a CUDA graph, or its CPU stand-in, and the target forward.

`specdec.graphs` decides what to capture and when; this module only knows how. A graph fixes every address
and shape, so the forward reads each round's inputs from one static buffer, builds its 4D mask inside the
graph, and has the layers write keys and values through a device index.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import kv_cache, masks

Row = tuple[torch.Tensor, int, "torch.Tensor | None", "torch.Tensor | None"]  # ids [T], past, mask [T, T], depth [T]


class CudaReplay:
    """fn captured as one torch.cuda.CUDAGraph (after warm-up on a side stream); calling it replays.

    Each graph has its own memory pool, so a failed capture cannot leave a shared pool recording.
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
    """Close a failed capture step by step, since torch's own exit stops at its first error."""
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
        self.addresses = _addresses(state)  # a real graph writes where these tensors were at capture

    def __call__(self) -> torch.Tensor:
        assert _addresses(self.state) == self.addresses, "a captured buffer moved: the graph would write freed memory"
        now = {a: getattr(self.state, a) for a in self.saved}
        for a, v in self.saved.items():
            setattr(self.state, a, v)
        try:
            self.out = self.fn()
        finally:
            for a, v in now.items():
                setattr(self.state, a, v)
        return self.out


def _addresses(state) -> list[int]:
    """Where a cache's buffers live (empty for anything without layers)."""
    return [t.data_ptr() for layer in getattr(state, "layers", ()) for t in (layer.keys, layer.values)
            if t is not None]


class Forward:
    """One captured target forward: B rows of Tb query tokens, over a KV buffer of C slots per row.

    B = 1 runs over a pooled SlotCache, B > 1 over a BatchCache's first B rows; a padding query sees only its
    own slot and no real query sees it, so each real row is what its own eager forward gives.
    """

    def __init__(self, target, cache, rows: int, tokens: int, capture: Callable) -> None:
        dev = target.device
        B, Tb, C = rows, tokens, cache.capacity
        # Per row: ids, positions, write slots, then Tb rows of the ancestor mask (0/1). [B, 3 + Tb, Tb]
        self.stage = torch.zeros(B, 3 + Tb, Tb, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.io = torch.zeros(B, 3 + Tb, Tb, dtype=torch.long, device=dev)
        # The copy from `stage` is asynchronous: the next round must not rewrite `stage` before it is done.
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.rows, self.tokens = B, Tb
        solo = isinstance(cache, kv_cache.SlotCache)

        def forward() -> torch.Tensor:
            ids, pos, slots = self.io[:, 0], self.io[:, 1], self.io[:, 2]  # [B, Tb] each
            mask = masks.additive(masks.visible(slots[:, 0], self.io[:, 3:].bool(), C), target.dtype)  # [B, 1, Tb, C]
            cache.write_index = slots[0] if solo else slots  # [Tb] for a SlotCache, [B, Tb] for a BatchCache
            try:
                out = target.base(input_ids=ids, position_ids=pos, attention_mask=mask, **{target.cache_arg: cache},
                                  use_cache=True)
            finally:
                cache.write_index = None
            return out.last_hidden_state  # [B, Tb, H]

        self.forward, self.cache, self.capture = forward, cache, capture
        self.replay = None  # captured on the first real round, since warm-up runs write at the inputs' slots

    def __call__(self, rows: list[Row]) -> torch.Tensor:
        """The round's `Row`s (None mask and depth: a chain), in rows 0.. -> hidden [b, T, H], T the longest."""
        self.fill(rows)
        self.io.copy_(self.stage, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        if self.replay is None:
            self.replay = self.capture(self.forward, self.cache)
        T = max(ids.shape[0] for ids, _, _, _ in rows)
        return self.replay()[: len(rows), :T].clone()  # the static output is overwritten by the next replay

    def fill(self, rows: list[Row]) -> None:
        """Write the round's inputs into the host staging buffer [B, 3 + Tb, Tb]."""
        Tb, s = self.tokens, self.stage  # [B, 3 + Tb, Tb]
        if self.copied is not None:
            self.copied.synchronize()  # the previous round's copy has long finished: the host synced since
        s.zero_()
        s[:, 2] = torch.arange(Tb)  # free rows: padding at slots [0, Tb)
        s[:, 3:] = torch.eye(Tb, dtype=torch.long)  # a padding query sees only its own slot
        for i, (ids, past, tree_mask, depth) in enumerate(rows):
            T, r = ids.shape[0], s[i]
            r[0, :T] = ids
            r[0, T:] = ids[0]  # padding: any real token id
            r[1, :] = past
            r[1, :T] += depth if depth is not None else torch.arange(T)
            r[2] += past
            r[3 : 3 + T, :T] = tree_mask if tree_mask is not None else torch.ones(T, T, dtype=torch.long).tril_()
