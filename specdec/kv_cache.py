"""Every KV-cache manipulation specdec does, in one place: transformers' cache API moves between versions.

After a tree forward the cache holds the prefix then all N nodes; `keep_path` gathers the accepted ones
right after the prefix (a gather, not a crop: they need not come first in tree order). Sliding and chunked
layers keep full history too, since HF's sliding layer drops entries a rollback cannot restore; that is
exact within the smallest window, and `Engine` refuses requests that would outrun it (`specdec.attention`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin


def _allocate(layer: CacheLayerMixin, rows: int, capacity: int, key_states: torch.Tensor,
              value_states: torch.Tensor) -> None:
    """Give a layer zeroed buffers [rows, kv_heads, capacity, head_dim] shaped like the first step's states.

    Layers that agree in shape are views of one block [L, 2, rows, kv_heads, capacity, head_dim], so `keep_path`
    commits them all with one gather and one copy; a layer that differs gets its own tensors.
    """
    owner, i = layer.owner, layer.index
    Hk, D, Dv = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
    dtype, device = key_states.dtype, key_states.device
    layer.dtype, layer.device = dtype, device
    if i == 0 and D == Dv and value_states.dtype == dtype:
        owner.block = torch.zeros(len(owner.layers), 2, rows, Hk, capacity, D, dtype=dtype, device=device)
    block = owner.block
    if (block is not None and block.shape[2:] == (rows, Hk, capacity, D) and value_states.shape[1] == Hk
            and Dv == D and block.dtype == dtype and block.device == device):
        layer.keys, layer.values = block[i, 0], block[i, 1]
    else:
        owner.block = None
        layer.keys = torch.zeros(rows, Hk, capacity, D, dtype=dtype, device=device)
        layer.values = torch.zeros(rows, Hk, capacity, Dv, dtype=value_states.dtype, device=device)
    layer.is_initialized = True


class _BufferLayer(CacheLayerMixin):
    """One layer of a preallocated buffer owned by its cache (held weakly: a dropped cache is freed at once)."""

    def __init__(self, owner: "SlotCache | BatchCache", index: int) -> None:
        super().__init__()
        self._owner, self.index = weakref.ref(owner), index

    @property
    def owner(self):
        return self._owner()

    def get_max_length(self) -> int:
        return self.owner.capacity


class _SlotLayer(_BufferLayer):
    """One layer's keys and values [1, kv_heads, capacity, head_dim]; a step writes [length, length + T)."""

    @property
    def is_compileable(self) -> bool:
        # Only a whole-buffer cache repeats shapes, and HF then builds a one-token step's mask it otherwise skips.
        return hides_slots(self.owner)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _allocate(self, key_states.shape[0], self.owner.capacity, key_states, value_states)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = self.owner.write_index
        if index is not None:  # slots given on the device (a CUDA graph replays this write at new slots)
            self.keys.index_copy_(2, index, key_states)
            self.values.index_copy_(2, index, value_states)
            return self.keys, self.values
        start = self.owner.length
        end = start + key_states.shape[-2]
        assert end <= self.owner.capacity, f"KV buffer overflow: {end} slots > capacity {self.owner.capacity}"
        self.keys[:, :, start:end] = key_states  # a copy into place: no allocation, no cat
        self.values[:, :, start:end] = value_states
        width = self.owner.width(end - start)
        return self.keys[:, :, :width], self.values[:, :, :width]  # views: no copy

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width(query_length), 0

    def get_seq_length(self) -> int:
        return self.owner.length


class SlotCache(Cache):
    """specdec's position-addressed KV buffer: `capacity` slots per layer, fixed at request start.

    Committed slot s holds position s; RoPE positions come from the caller's `position_ids`, so a tree's nodes
    can sit at any slot.
    """

    def __init__(self, num_layers: int, capacity: int, fixed_shapes: bool = True) -> None:
        self.capacity = int(capacity)
        self.length = 0
        # The whole buffer repeats shapes, as CUDA graphs need; the slots in use do less work eagerly.
        self.fixed_shapes = fixed_shapes
        # [T] slots on the device for the next forward, not [length, length + T): set only around a captured one
        self.write_index: torch.Tensor | None = None
        self.block: torch.Tensor | None = None  # [L, 2, 1, Hk, capacity, D]: every layer's keys and values
        super().__init__(layers=[_SlotLayer(self, i) for i in range(num_layers)])

    def width(self, new_tokens: int) -> int:
        """Key slots a forward of `new_tokens` attends over."""
        return self.capacity if self.fixed_shapes else self.length + new_tokens

    @property
    def allocated(self) -> bool:
        return bool(self.layers) and self.layers[0].is_initialized

    def sharing(self) -> "SlotCache":
        """An empty cache over this one's buffers (no copy): a pooled buffer lent to the next request."""
        assert self.allocated, "allocate the buffers (one forward) before sharing them"
        other = SlotCache(len(self.layers), self.capacity, self.fixed_shapes)
        other.block = self.block
        for mine, theirs in zip(other.layers, self.layers):
            mine.dtype, mine.device = theirs.dtype, theirs.device
            mine.keys, mine.values, mine.is_initialized = theirs.keys, theirs.values, True
        return other


class _RowsLayer(_BufferLayer):
    """One layer's keys and values for a batch of rows [R, kv_heads, capacity, head_dim], each at its length."""

    is_compileable = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _allocate(self, self.owner.rows, self.owner.capacity, key_states, value_states)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        o = self.owner
        b, Hk, T, D = key_states.shape  # [b, Hk, T, D]
        captured = o.write_index is not None  # a captured forward over rows [0, b): slots given on the device
        lo, width = (0, self.keys.shape[2]) if captured else (o.lo, o.width)
        slots = o.write_index if captured else o.slots(T, key_states.device)  # [b, T]
        keys, values = self.keys[lo : lo + b], self.values[lo : lo + b]  # views of the rows in this forward
        keys.scatter_(2, slots[:, None, :, None].expand(b, Hk, T, D), key_states)
        values.scatter_(2, slots[:, None, :, None].expand(b, Hk, T, value_states.shape[-1]), value_states)
        return keys[:, :, :width], values[:, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return min(self.owner.starts, default=0)


class BatchCache(Cache):
    """The position-addressed KV buffer of a batch: `rows` requests, one committed length per row.

    A forward covers contiguous rows (`begin`); a request holds a `RowCache`, its view of one row.
    """

    def __init__(self, num_layers: int, rows: int, capacity: int, fixed_shapes: bool = True) -> None:
        self.rows = int(rows)
        self.capacity = int(capacity)
        self.lengths = [0] * self.rows
        self.fixed_shapes = fixed_shapes  # attend over the whole buffer (CUDA graphs), or the slots in use
        self.lo, self.starts, self.width = 0, [], 0  # the forward in progress: set by `begin`
        self._slots: torch.Tensor | None = None
        self.write_index: torch.Tensor | None = None  # [b, T] slots on the device: set only around a captured forward
        self.graphs: dict = {}  # captured forwards over this buffer, by (capacity, rows, bucket) (specdec.graphs)
        self.block: torch.Tensor | None = None  # [L, 2, rows, Hk, capacity, D]: every layer's keys and values
        super().__init__(layers=[_RowsLayer(self, i) for i in range(num_layers)])

    def begin(self, lo: int, count: int, new_tokens: int) -> int:
        """Set up a forward of `new_tokens` per row over rows [lo, lo + count); returns the key width."""
        assert 0 <= lo and lo + count <= self.rows
        self.lo, self.starts = lo, self.lengths[lo : lo + count]
        end = max(self.starts) + new_tokens
        assert end <= self.capacity, f"KV buffer overflow: {end} slots > capacity {self.capacity}"
        self.width = self.capacity if self.fixed_shapes else end
        self._slots = None
        return self.width

    def slots(self, new_tokens: int, device) -> torch.Tensor:
        """[b, T] the slot each row's new tokens are written at (built once per forward)."""
        if self._slots is None:
            start = torch.tensor(self.starts, device=device)
            self._slots = start[:, None] + torch.arange(new_tokens, device=device)
        return self._slots

    @property
    def allocated(self) -> bool:
        return bool(self.layers) and self.layers[0].is_initialized

    @torch.inference_mode()
    def grow(self, capacity: int) -> None:
        """Make room for `capacity` slots per row (the committed slots move along; rare: capacities are bucketed)."""
        if capacity <= self.capacity:
            return
        if self.block is not None:
            block = self.block.new_zeros(*self.block.shape[:4], capacity, self.block.shape[-1])
            block[..., : self.capacity, :] = self.block
            self.block = block
            for i, layer in enumerate(self.layers):
                if layer.is_initialized:
                    layer.keys, layer.values = block[i, 0], block[i, 1]
            self.capacity = capacity
            return
        for layer in self.layers:
            if layer.is_initialized:
                pad = capacity - self.capacity
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(*layer.keys.shape[:2], pad,
                                                                         layer.keys.shape[-1])], 2)
                layer.values = torch.cat([layer.values, layer.values.new_zeros(*layer.values.shape[:2], pad,
                                                                               layer.values.shape[-1])], 2)
        self.capacity = capacity

    @torch.inference_mode()
    def adopt(self, row: int, cache: Cache) -> None:
        """Copy a request's own committed KV (a SlotCache after its prefill) into `row`."""
        n = length(cache)
        assert n <= self.capacity, f"{n} committed slots do not fit a capacity of {self.capacity}"
        self.lengths[row] = n
        if n == 0:  # nothing committed yet (its buffer may not even be allocated): the row's slots are hidden
            return
        for mine, theirs in zip(self.layers, _layers(cache)):
            if not mine.is_initialized:
                mine.lazy_initialization(theirs.keys, theirs.values)
            mine.keys[row, :, :n] = theirs.keys[0, :, :n]
            mine.values[row, :, :n] = theirs.values[0, :, :n]

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Copy row `src`'s committed slots to row `dst` (a leaving request's row is refilled from the last one)."""
        n = self.lengths[src]
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[dst, :, :n] = layer.keys[src, :, :n]
                layer.values[dst, :, :n] = layer.values[src, :, :n]
        self.lengths[dst] = n

    @torch.inference_mode()
    def clear(self, row: int) -> None:
        """Zero a row: after a failure its stale slots may hold NaN, which a masked score (NaN + min) would spread."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[row].zero_()
                layer.values[row].zero_()
        self.lengths[row] = 0


@dataclass
class RowCache:
    """One request's view of its row of a BatchCache (`row` changes when the batch is compacted)."""

    batch: BatchCache
    row: int

    @property
    def length(self) -> int:
        return self.batch.lengths[self.row]


def bucket(n: int, step: int = 64) -> int:
    """Round a capacity up so that buffer and mask shapes repeat across requests."""
    return -(-n // step) * step


def new_cache(model, capacity: int | None = None) -> Cache:
    """An empty cache: a SlotCache of `capacity` slots, or (None) plain growing full-history layers."""
    if capacity is not None:
        cuda = next(model.parameters()).device.type == "cuda"
        return SlotCache(model.config.get_text_config(decoder=True).num_hidden_layers, capacity, fixed_shapes=cuda)
    return DynamicCache()  # no config: no sliding layers, see above


def _layers(cache: Cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("unsupported transformers cache API: DynamicCache has no `layers` (tested with 5.23)")
    return layers


def length(cache: Cache) -> int:
    """Committed tokens (for a DynamicCache, every token it holds)."""
    return cache.length if isinstance(cache, (SlotCache, RowCache)) else int(cache.get_seq_length())


def mask_width(cache: Cache, new_tokens: int) -> int:
    """Key slots a forward of `new_tokens` attends over: the whole buffer, or past + new."""
    return cache.width(new_tokens) if isinstance(cache, SlotCache) else length(cache) + new_tokens


def hides_slots(cache: Cache) -> bool:
    """Must a 4D mask hide uncommitted slots (a whole-buffer SlotCache)? Else HF's causal masks are exact."""
    return isinstance(cache, SlotCache) and cache.fixed_shapes


def advance(cache: Cache, new_tokens: int) -> None:
    """After a forward: count the tokens it wrote (a DynamicCache grew by itself)."""
    if isinstance(cache, SlotCache):
        cache.length += new_tokens


@torch.inference_mode()
def keep_path(cache: Cache, prefix_len: int, nodes: list[int]) -> None:
    """Keep the prefix plus the tree nodes `nodes` (indices after the prefix), in that order.

    Args:
        prefix_len: committed tokens before the tree.
        nodes: accepted node indices, increasing (ancestors precede descendants in BFS order).
    """
    n = len(nodes)
    owner, row = (cache.batch, cache.row) if isinstance(cache, RowCache) else (cache, 0)
    if nodes != list(range(n)):
        block = getattr(owner, "block", None)
        if block is not None:
            parts = [block[:, :, row]]  # [L, 2, Hk, C, D]: every layer's keys and values
        else:
            parts = [t[row] for layer in _layers(owner) if layer.keys is not None and layer.keys.numel()
                     for t in (layer.keys, layer.values)]  # [Hk, C, D] each
        if parts:
            idx = torch.tensor(nodes, device=parts[0].device) + prefix_len
            dest = torch.arange(prefix_len, prefix_len + n, device=parts[0].device)
            for t in parts:  # index_select copies first, so overlapping source/target slots are safe
                t.index_copy_(t.dim() - 2, dest, t.index_select(t.dim() - 2, idx))
    if isinstance(cache, RowCache):
        cache.batch.lengths[row] = prefix_len + n
    elif isinstance(cache, SlotCache):
        cache.length = prefix_len + n  # the slots after it are garbage, hidden by the mask
    else:  # HF's growing cache: drop what follows
        for layer in _layers(cache):
            if layer.keys is not None and layer.keys.numel():
                layer.keys = layer.keys[..., : prefix_len + n, :]
                layer.values = layer.values[..., : prefix_len + n, :]


@torch.inference_mode()
def snapshot(cache: Cache, upto: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the first `upto` entries of every layer (for the prefix cache), each [1, kv_heads, upto, D]."""
    if isinstance(cache, RowCache):  # its row of the batch's buffer
        r = cache.row
        return [(l.keys[r : r + 1, :, :upto].clone(), l.values[r : r + 1, :, :upto].clone())
                for l in _layers(cache.batch)]
    return [(l.keys[..., :upto, :].clone(), l.values[..., :upto, :].clone()) for l in _layers(cache)]


@torch.inference_mode()
def restore(model, saved: list[tuple[torch.Tensor, torch.Tensor]], upto: int, capacity: int | None = None,
            into: Cache | None = None) -> Cache:
    """A cache holding the first `upto` entries of a snapshot (copied, so the snapshot stays intact).

    Args:
        into: an empty cache to fill (a pooled buffer the captured forwards write); None makes a fresh one.
    """
    cache = into if into is not None else new_cache(model, capacity)
    if isinstance(cache, SlotCache):
        for layer, (k, v) in zip(cache.layers, saved):
            if not layer.is_initialized:
                layer.lazy_initialization(k, v)
            layer.keys[:, :, :upto] = k[..., :upto, :]
            layer.values[:, :, :upto] = v[..., :upto, :]
        cache.length = upto
        return cache
    for i, (k, v) in enumerate(saved):
        cache.update(k[..., :upto, :].clone(), v[..., :upto, :].clone(), i)
    return cache


def nbytes(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in saved)
