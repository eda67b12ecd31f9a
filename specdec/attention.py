"""A model's attention layout: each decoder layer's type and window, read as HF's own cache builder reads it.

A tree's rollback gathers plain keys and values per position, so only full, sliding and chunked attention
(kept as full history, see `specdec.kv_cache`) take part; recurrent or shared-state layers are refused.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    """The attention layout of a model config; ValueError names a layer type a rollback cannot restore."""
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
