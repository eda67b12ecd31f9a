"""The EAGLE-3 drafter (Li et al., 2025): one small decoder layer that drafts a tree autoregressively.

`fc` fuses three of the target's hidden states into g_t; at position t the layer reads
[embed(x_{t+1}) ‖ g_t], attends over its own KV cache and gives reduced-vocabulary logits (target id =
draft id + d2t[draft id]). A child reads its parent's output in place of g, and trees grow as in EAGLE-2.
Drafting reads only committed tokens and target features, so output is exact whatever the draft.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .draft_tree import build_tree
from .drafter import Proposal

SOURCE = "eagle3"  # events name this drafter's nodes so


@dataclass(frozen=True)
class EagleConfig:
    """The draft layer's shape: a one-layer Llama config, plus what ties it to its target."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    layers: tuple[int, int, int] | None  # the target's states fused: HF `output_hidden_states` indices (None: unknown)
    target_hidden_size: int | None = None  # the fused states' width when it differs from hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # as in a Llama config (e.g. Llama-3.1's "llama3")
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    base_model: str | None = None  # informational: what it was trained on
    target_layers: int | None = None  # the target's depth, where known (its default taps follow from it)

    @property
    def feature_size(self) -> int:
        return self.target_hidden_size or self.hidden_size


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """The layers EAGLE-3 taps, as HF `hidden_states` indices: (2, L // 2, L - 3), spread out if shallow."""
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return (1, max(num_layers // 2, 1), max(num_layers - 1, 1))


def _llama_config(cfg: EagleConfig):
    from transformers import LlamaConfig

    rope = {"rope_theta": cfg.rope_theta, "rope_type": "default", **(cfg.rope_scaling or {})}
    if "type" in rope and "rope_type" not in (cfg.rope_scaling or {}):
        rope["rope_type"] = rope.pop("type")
    return LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                       num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                       intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
                       max_position_embeddings=cfg.max_position_embeddings, hidden_act=cfg.hidden_act,
                       rope_parameters=rope, vocab_size=cfg.vocab_size, num_hidden_layers=1)


class _Attention(nn.Module):
    """Llama attention whose q/k/v read 2H (token ‖ feature); o writes H."""

    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)


class _MidLayer(nn.Module):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        llama = _llama_config(cfg)
        self.self_attn = _Attention(cfg)
        self.mlp = LlamaMLP(llama)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class DraftCache:
    """A request's drafter KV cache: keys and values [kv_heads, capacity, head_dim], grown in place."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0  # committed entries; a round's tree entries sit after them until `truncate`

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write n new entries after the current ones -> every entry so far [kvh, length + n, d]."""
        n = k.shape[1]
        need = self.length + n
        if self.k is None or need > self.k.shape[1]:
            cap = max(64, 1 << (need - 1).bit_length())
            grown_k = k.new_zeros(k.shape[0], cap, k.shape[2])
            grown_v = v.new_zeros(v.shape[0], cap, v.shape[2])
            if self.k is not None:
                grown_k[:, : self.length] = self.k[:, : self.length]
                grown_v[:, : self.length] = self.v[:, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, self.length : need] = k
        self.v[:, self.length : need] = v
        self.length = need
        return self.k[:, :need], self.v[:, :need]

    def truncate(self, length: int) -> None:
        self.length = length


class Eagle3(nn.Module):
    """The draft model. `embed` is the target's input embedding table unless the checkpoint has its own."""

    def __init__(self, cfg: EagleConfig, embed: nn.Module | None = None) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = cfg
        self.fc = nn.Linear(3 * cfg.feature_size, cfg.hidden_size, bias=False)
        self.midlayer = _MidLayer(cfg)
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(_llama_config(cfg))
        self.embed = [embed]  # a list: the target's table is not this module's parameter (nor saved with it)
        self.own_embed: nn.Embedding | None = None

    # -- the math ---------------------------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        table = self.own_embed if self.own_embed is not None else self.embed[0]
        return table(tokens)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's tapped states [..., 3 * feature_size] -> g [..., H]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def step(self, tokens: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, cache: DraftCache | None,
             visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the layer over n new positions after the cache's committed ones.

        Args:
            tokens: [n] the token that followed each position (what the layer embeds).
            g: [n, H] each position's feature: fused target states, or a parent node's output.
            positions: [n] their positions (RoPE).
            cache: the request's drafter cache (the new entries are appended), or None (no context).
            visible: [n, past + n] bool, which cache entries each new position attends to (None: every
                committed one, and the new ones causally).
        Returns:
            the layer's output [n, H] (a child's feature) and draft-vocabulary logits [n, Vd] float32.
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        n = tokens.shape[0]
        x = torch.cat([layer.input_layernorm(self.embed_tokens(tokens).to(g.dtype)), layer.hidden_norm(g)], -1)
        q = attn.q_proj(x).view(n, attn.heads, attn.head_dim).transpose(0, 1)  # [h, n, d]
        k = attn.k_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)  # [kvh, n, d]
        v = attn.v_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)
        cos, sin = self.rotary(x[None], positions[None].to(x.device))  # [1, n, d]
        q, k = _rope(q, k, cos[0], sin[0])
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        if visible is None:
            visible = torch.ones(n, past + n, dtype=torch.bool)
            visible[:, past:] = torch.ones(n, n, dtype=torch.bool).tril_()
        mask = visible.to(x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None],
                                           enable_gqa=attn.heads != attn.kv_heads)  # [h, n, d]
        h = g + attn.o_proj(o.transpose(0, 1).reshape(n, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, self.lm_head(self.norm(h)).float()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return draft_ids + self.d2t[draft_ids]


def _rope(q, k, cos, sin):
    def rot(x):
        a, b = x.chunk(2, -1)
        return torch.cat([-b, a], -1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


@dataclass
class EagleRun:
    """A request's drafter state: its cache, and committed positions awaiting their next token."""

    cache: DraftCache = field(default_factory=DraftCache)
    start: int = 0  # position of features[0]
    features: list = field(default_factory=list)  # tensors [m_i, 3 * feature_size], from `start` on
    follow: list = field(default_factory=list)  # ints: the tokens known after them (one fewer until emitted)
    last: tuple | None = None  # (output [H], logits [Vd]) of the last fed position: the root's children

    def add(self, rows: torch.Tensor, tokens: list[int], position: int | None = None) -> None:
        """Queue the next committed positions' tapped rows (from `position`, if first) and next tokens."""
        if not self.features and position is not None and not self.cache.length:
            self.start = position
        self.features.append(rows)
        self.follow.extend(tokens)


@dataclass(frozen=True)
class Shape:
    """An EAGLE-2 tree's size; the default is a 16-node tree."""

    budget: int = 15  # drafted nodes at most, the root excluded
    depth: int = 5  # levels
    top_k: int = 4  # children per expanded node, and nodes expanded per level

    def __post_init__(self) -> None:
        for name, lo in (("budget", 1), ("depth", 1), ("top_k", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"`{name}` must be an integer >= {lo}, got {v!r}")


class Eagle3Drafter:
    """EAGLE-3 behind `drafter.Drafter`: one model and tree shape, an `EagleRun` per request."""

    source = SOURCE

    def __init__(self, model: Eagle3, shape: "Shape | None" = None) -> None:
        self.model = model
        self.shape = shape or Shape()

    def start(self) -> EagleRun:
        return EagleRun()

    def propose(self, state: EagleRun, root: int, room: int) -> Proposal | None:
        s = self.shape
        return draft(self.model, state, root, s.budget, min(s.depth, room), s.top_k)


@torch.inference_mode()
def draft(model: Eagle3, run: EagleRun, root: int, budget: int, depth: int, top_k: int) -> Proposal | None:
    """Feed the committed positions, then grow an EAGLE-2 tree under `root`; None before any context.

    Args:
        budget: drafted nodes kept at most (root excluded), the best by cumulative log-probability.
        top_k: nodes expanded per level, and children per expanded node.
    """
    feed(model, run)
    if run.last is None or budget < 1 or depth < 1:
        return None
    h_root, logits = run.last
    committed = run.cache.length
    base = run.start + committed  # the position of depth-1 nodes' entries
    tokens, parents, depths, qs, scores = [root], [-1], [0], [None], [0.0]
    out_of, entry = {0: h_root}, {}
    level = _children(model, logits[None], [0], tokens, parents, depths, qs, scores, top_k)
    try:
        for d in range(1, depth):
            expand = sorted(level, key=lambda i: (-scores[i], i))[:top_k]
            n = len(expand)
            past = run.cache.length
            visible = torch.zeros(n, past + n, dtype=torch.bool)
            visible[:, :committed] = True
            for j, i in enumerate(expand):
                visible[j, past + j] = True
                a = parents[i]
                while a > 0:  # its ancestors' entries, written by earlier levels
                    visible[j, entry[a]] = True
                    a = parents[a]
                entry[i] = past + j
            toks = torch.tensor([tokens[i] for i in expand], dtype=torch.long, device=h_root.device)
            g = torch.stack([out_of[parents[i]] for i in expand])  # [n, H] each parent's output
            h, lg = model.step(toks, g, torch.full((n,), base + d - 1, dtype=torch.long), run.cache, visible)
            out_of.update({i: h[j] for j, i in enumerate(expand)})
            level = _children(model, lg, expand, tokens, parents, depths, qs, scores, top_k)
    finally:
        run.cache.truncate(committed)  # the tree's entries go; the committed context stays
    return _rerank(tokens, parents, depths, qs, scores, budget)


def _children(model: Eagle3, logits: torch.Tensor, nodes: list[int], tokens, parents, depths, qs, scores,
              top_k: int) -> list[int]:
    """Add each node's `top_k` likeliest children (logits [n, Vd], one row per node); -> their indices."""
    lp = torch.log_softmax(logits.float(), -1)
    top_l, top_i = torch.topk(lp, min(top_k, lp.shape[-1]), dim=-1)  # [n, k]
    ids = model.to_target(top_i).tolist()
    out = []
    for j, i in enumerate(nodes):
        for s, t in zip(top_l[j].tolist(), ids[j]):
            tokens.append(int(t))
            parents.append(i)
            depths.append(depths[i] + 1)
            qs.append(math.exp(s))
            scores.append(scores[i] + s)
            out.append(len(tokens) - 1)
    return out


def _rerank(tokens, parents, depths, qs, scores, budget) -> Proposal:
    # A child never outscores its parent, so the best `budget` nodes form a tree.
    order = sorted(range(1, len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:budget]
    keep = set(order)
    path: dict[int, tuple] = {0: ()}
    rank: dict[int, int] = {}
    for i in sorted(keep, key=lambda i: (depths[i], i)):  # parents first; siblings in draft order
        p = parents[i]
        r = rank.get(p, 0)
        rank[p] = r + 1
        path[i] = path[p] + (r,)
    tree = build_tree(tuple(path[i] for i in keep))
    at = {path[i]: i for i in keep}
    nodes = [at[p] for p in tree.paths[1:]]
    return Proposal(tree, [tokens[0]] + [tokens[i] for i in nodes], [None] + [qs[i] for i in nodes], SOURCE)


def feed(model: Eagle3, run: EagleRun) -> None:
    """Run the layer over the committed positions whose following token is known."""
    if not run.features:
        return
    rows = torch.cat(run.features)  # [m, 3F]
    n = min(rows.shape[0], len(run.follow))
    if n == 0:
        return
    g = model.fuse(rows[:n])
    first = run.start + run.cache.length
    toks = torch.tensor(run.follow[:n], dtype=torch.long, device=g.device)
    h, logits = model.step(toks, g, torch.arange(first, first + n), run.cache)
    run.last = (h[-1], logits[-1])
    rest = rows[n:]
    run.features = [rest] if rest.shape[0] else []
    run.follow = run.follow[n:]
