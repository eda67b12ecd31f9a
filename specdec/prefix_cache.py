"""A prefix KV cache: reuse the prefill of prompt prefixes seen before.

Causal attention makes the first n positions' keys and values depend only on the first n tokens, so an
entry sharing n leading tokens seeds a new prompt's cache (one token is always left to prefill, for its
hidden state). LRU within a byte budget under one lock; lookups return copies, so decoding never corrupts
an entry.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from . import kv_cache


@dataclass
class _Entry:
    ids: torch.Tensor  # [T] long, on the CPU (for prefix comparison)
    kv: list  # per layer (keys, values), each [1, H, T, Dh]
    nbytes: int


class PrefixCache:
    def __init__(self, max_bytes: int = 256 * 1024 * 1024, min_tokens: int = 8) -> None:
        if max_bytes < 0:
            raise ValueError(f"`max_bytes` must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens  # shorter matches are not worth a copy
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def lookup(self, model, ids: list[int], capacity: int | None = None, into=None):
        """(A cache seeded with the longest shared prefix, its length), or (None, 0).

        Args:
            capacity: the request's KV-buffer size (None: a growing DynamicCache).
            into: an empty cache to seed instead of a fresh one (the request's own buffer).
        """
        query = torch.tensor(ids, dtype=torch.long)
        with self._lock:
            self.lookups += 1
            best_key, best_n = None, 0
            for key, e in self._entries.items():
                m = min(len(e.ids), len(query))
                diff = (e.ids[:m] != query[:m]).nonzero()
                n = int(diff[0]) if len(diff) else m
                if n > best_n:
                    best_key, best_n = key, n
            best_n = min(best_n, len(ids) - 1)
            if best_key is None or best_n < self.min_tokens:
                return None, 0
            self._entries.move_to_end(best_key)
            entry = self._entries[best_key]
            self.hits += 1
            return kv_cache.restore(model, entry.kv, best_n, capacity, into), best_n

    def insert(self, ids: list[int], cache) -> None:
        """Store the KV of the whole prompt (the cache must hold at least len(ids) positions)."""
        key = tuple(ids)
        if len(ids) < self.min_tokens:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
        kv = kv_cache.snapshot(cache, len(ids))  # the copy runs outside the lock
        size = kv_cache.nbytes(kv)
        if size > self.max_bytes:
            return
        with self._lock:
            # Another thread may have inserted this prompt while we copied: replace it so `bytes` stays exact.
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._entries[key] = _Entry(torch.tensor(ids, dtype=torch.long), kv, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
