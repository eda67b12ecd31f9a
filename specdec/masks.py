"""The one 4D attention mask builder: what each new token of a round sees, eagerly or in a captured graph.

A row holds `past` committed tokens in key slots [0, past) and its T new tokens in [past, past + T); new
token t sees every committed slot and its tree ancestors and itself. Every other slot (unused, stale, another
request's padding) is hidden, and sliding-window layers also hide keys at or beyond the window.
"""
from __future__ import annotations

import torch


def visible(past: torch.Tensor, see: torch.Tensor, width: int) -> torch.Tensor:
    """Which of `width` key slots each new token sees -> [b, T, width] bool.

    Args:
        past: [b] committed tokens per row.
        see: [b, T, T] bool, new token t sees new token s (its ancestors and itself).
    """
    b, T, _ = see.shape
    slots = past[:, None] + torch.arange(T, device=see.device)  # [b, T] where each row's new tokens sit
    out = (torch.arange(width, device=see.device) < past[:, None, None]).expand(b, T, width).contiguous()
    return out.scatter_(2, slots[:, None, :].expand(b, T, T), see)


def additive(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[b, T, width] bool -> the additive mask [b, 1, T, width] HF's attention takes (0 seen, min hidden)."""
    return torch.where(seen, torch.zeros((), dtype=dtype, device=seen.device), torch.finfo(dtype).min)[:, None]


def build(past: torch.Tensor, see: torch.Tensor, depth: torch.Tensor, width: int, dtype: torch.dtype,
          window: int | None = None, window_mode: str | None = None):
    """The mask argument of a round: [b, 1, T, width], or with `window_mode` "mapping" a dict per layer type.

    Args:
        depth: [b, T] each new token's depth (its position is past + depth).
        window_mode: "uniform" (every layer slides), "mapping" (full and sliding layers mix), or None.
    """
    mask = additive(visible(past, see, width), dtype)
    if window_mode not in ("uniform", "mapping"):
        return mask
    pos = past[:, None] + depth  # [b, T]
    if int(pos.max()) < window:
        return mask
    # HF's sliding rule: query position q sees key position k iff k > q - window. Slot s < past holds position s.
    T = see.shape[1]
    slots = past[:, None] + torch.arange(T, device=see.device)
    key_pos = torch.arange(width, device=see.device).repeat(len(past), 1).scatter_(1, slots, pos)  # [b, width]
    windowed = mask.masked_fill((key_pos[:, None, :] <= pos[:, :, None] - window)[:, None], torch.finfo(dtype).min)
    return windowed if window_mode == "uniform" else {"full_attention": mask, "sliding_attention": windowed}
