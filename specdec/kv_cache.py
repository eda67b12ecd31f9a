"""Every KV-cache manipulation specdec does, in one place.

Tested with transformers 5.23 (`DynamicCache` made of `DynamicLayer`s whose
`keys`/`values` are [B, H, T, Dh]). The cache API moved between 5.17 and
5.24 (`crop` now takes a negative count; the model kwarg is being renamed),
so nothing outside this module touches cache internals.

After a tree forward the cache holds the committed prefix followed by all
N tree nodes. `keep_path` gathers the accepted nodes' entries into the
slots right after the prefix and drops the rest: a gather, not a crop,
because the accepted nodes need not be the first ones in tree order.

Sliding-window (and chunked) attention layers get a plain full-history
layer too: HF's sliding layer drops old entries as it goes, which a tree
rollback cannot undo. Within the smallest window the window hides nothing,
so the result is exact there; `Engine` refuses requests that would outrun it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

# Layer types whose cache is plain keys/values per position, so a gather can roll a tree back.
_WINDOWED = ("sliding_attention", "chunked_attention")
SUPPORTED_LAYER_TYPES = ("full_attention",) + _WINDOWED


@dataclass(frozen=True)
class AttentionLayout:
    """Per decoder layer: its attention type and its window (None for full attention)."""

    types: tuple[str, ...]
    windows: tuple[int | None, ...]

    @property
    def window(self) -> int | None:
        """The smallest sliding or chunk window, or None when every layer attends to everything."""
        ws = [w for w in self.windows if w]
        return min(ws) if ws else None


def attention_layout(config) -> AttentionLayout:
    """The attention layout of a model config, as HF's own cache builder reads it.

    Raises ValueError naming the layer type when a layer keeps state a tree rollback cannot
    restore: linear attention, state-space and other recurrent or hybrid layers, shared KV.
    """
    text = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    bad = sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})
    if bad:
        raise ValueError(f"{type(text).__name__} has {bad[0]!r} layers ({', '.join(bad)}): their cache is "
                         "recurrent or shared state, which speculative tree rollback cannot restore exactly. "
                         f"specdec supports layers of type {', '.join(SUPPORTED_LAYER_TYPES)}")
    windows = tuple(int(kw["sliding_window"]) if t in _WINDOWED and kw.get("sliding_window") else None
                    for t, kw in zip(types, kwargs))
    return AttentionLayout(tuple(types), windows)


def new_cache(model) -> DynamicCache:
    """An empty cache of plain full-history layers (no config: no sliding layers, see above)."""
    return DynamicCache()


def _layers(cache: DynamicCache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("unsupported transformers cache API: DynamicCache has no `layers` (tested with 5.23)")
    return layers


def length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


@torch.inference_mode()
def keep_path(cache: DynamicCache, prefix_len: int, nodes: list[int]) -> None:
    """Keep the prefix plus the tree nodes `nodes` (indices after the prefix), in that order.

    Args:
        prefix_len: committed tokens before the tree.
        nodes: accepted node indices, increasing (ancestors precede descendants in BFS order).
    """
    n = len(nodes)
    contiguous = nodes == list(range(n))
    idx = None
    for layer in _layers(cache):
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        if not contiguous:
            if idx is None:  # built once, not once per layer
                idx = torch.tensor(nodes, device=layer.keys.device) + prefix_len
            # advanced indexing copies first, so overlapping source/target slots are safe
            layer.keys[..., prefix_len : prefix_len + n, :] = layer.keys[..., idx, :]
            layer.values[..., prefix_len : prefix_len + n, :] = layer.values[..., idx, :]
        layer.keys = layer.keys[..., : prefix_len + n, :]
        layer.values = layer.values[..., : prefix_len + n, :]


def crop(cache: DynamicCache, new_len: int) -> None:
    """Drop every entry after the first `new_len`."""
    for layer in _layers(cache):
        if layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys[..., :new_len, :]
            layer.values = layer.values[..., :new_len, :]


@torch.inference_mode()
def snapshot(cache: DynamicCache, upto: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the first `upto` entries of every layer (for the prefix cache)."""
    return [(l.keys[..., :upto, :].clone(), l.values[..., :upto, :].clone()) for l in _layers(cache)]


@torch.inference_mode()
def restore(model, saved: list[tuple[torch.Tensor, torch.Tensor]], upto: int) -> DynamicCache:
    """A fresh cache holding the first `upto` entries of a snapshot (copied, so the snapshot stays intact)."""
    cache = new_cache(model)
    for i, (k, v) in enumerate(saved):
        cache.update(k[..., :upto, :].clone(), v[..., :upto, :].clone(), i)
    return cache


def nbytes(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in saved)
