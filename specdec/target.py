"""The target model: any HF causal LM, driven through its public inputs.

Tree attention needs only what `forward` already accepts: a 4D additive
attention mask [B, 1, q, past + q] and `position_ids`. We call the base
model (one forward) for the last hidden states, which the draft heads
read, and apply the output projection ourselves, only to the rows the
verifier visits.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from . import kv_cache
from .sampler import finite_logits

log = logging.getLogger(__name__)
# Attention implementations that take an arbitrary 4D additive mask. Flash-attention, flex and paged
# kernels build their own causal masks (or read varlen metadata) and would drop the tree's mask.
MASK_AWARE_ATTENTION = ("sdpa", "eager")


class TargetModel:
    """Thin wrapper: hidden states from one forward, logits on demand."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model.eval()
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None or self.base is model:
            raise ValueError(f"{type(model).__name__} is not a causal LM with a separate output projection")
        cfg = model.config
        # Decided once, at load: refuse what cannot roll back, switch what would ignore the tree mask.
        self.layer_types, self.window = kv_cache.attention_layout(cfg)
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl not in MASK_AWARE_ATTENTION:
            log.warning("attention implementation %r ignores a 4D tree mask; switching %s to 'sdpa'",
                        impl, type(model).__name__)
            try:
                model.set_attn_implementation("sdpa")
            except (ValueError, ImportError, AttributeError) as e:
                raise ValueError(f"attention implementation {impl!r} ignores the 4D tree mask, and switching "
                                 f"{type(model).__name__} to 'sdpa' failed ({e}); load it with "
                                 "attn_implementation='sdpa' or 'eager'") from e
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.logit_scale = getattr(cfg, "logit_scale", None)  # Cohere-style scaling
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.hidden_size = int(self.lm_head.weight.shape[1])
        self.max_length = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                depth: torch.Tensor | None = None) -> torch.Tensor:
        """Run T new tokens after the cached prefix; returns hidden states [T, H].

        Args:
            input_ids: [T] long.
            tree_mask: [T, T] bool ancestor mask, or None for plain causal attention.
            depth: [T] position offsets (tree depth), required with tree_mask.
        """
        past = kv_cache.length(cache)
        T = input_ids.shape[0]
        kwargs = {}
        if tree_mask is not None:
            neg = torch.finfo(self.dtype).min
            mask = torch.zeros(1, 1, T, past + T, dtype=self.dtype, device=self.device)
            mask[0, 0, :, past:].masked_fill_(~tree_mask.to(self.device), neg)
            kwargs["attention_mask"] = mask
            pos = depth.to(self.device) + past
        else:
            pos = torch.arange(past, past + T, device=self.device)
        out = self.base(input_ids=input_ids.to(self.device)[None], position_ids=pos[None],
                        past_key_values=cache, use_cache=True, **kwargs)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] float32 logits, as the model's own head computes them."""
        x = self.lm_head(hidden)
        if self.logit_scale is not None:
            x = x * self.logit_scale
        if self.softcap:
            x = torch.tanh(x / self.softcap) * self.softcap
        return finite_logits(x.float())  # an fp16 overflow to +inf must not become NaN downstream
