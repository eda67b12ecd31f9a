"""Medusa draft heads (Cai et al., 2024).

Head k reads the target's last hidden state at position t and predicts token t+k+2 (the target's lm_head
gives t+1, the tree's root). A head is `n` residual blocks `x + SiLU(Linear(x))`, zero-initialised so it
starts as the identity, then a vocabulary projection: a copy of the base lm_head, or that lm_head shared.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_NAME = "heads_config.json"
WEIGHTS_NAME = "heads.safetensors"
TREE_NAME = "tree.json"


@dataclass(frozen=True)
class HeadsConfig:
    hidden_size: int  # must equal the target's hidden size
    vocab_size: int  # must equal the target's vocabulary size
    num_heads: int = 4  # K: tree depth below the root
    num_layers: int = 1  # residual blocks per head (Medusa's default is 1)
    shared_lm_head: bool = False  # reuse the target's lm_head instead of K copies
    base_model: str | None = None  # informational: what the heads were trained on


class ResBlock(nn.Module):
    """x + SiLU(W x + b), with W = 0 at init so the block is the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads. forward(hidden [..., H]) -> logits [K, ..., V]."""

    def __init__(self, config: HeadsConfig, base_lm_head: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        if config.num_heads < 1 or config.num_layers < 0:
            raise ValueError(f"num_heads must be >= 1 and num_layers >= 0, got {config.num_heads}, {config.num_layers}")
        # Every block is its own module: `[ResBlock(h)] * n` would share one.
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
            for _ in range(config.num_heads)
        )
        # A plain list keeps the target's lm_head out of state_dict.
        self._shared: list[nn.Module] = []
        if config.shared_lm_head:
            if base_lm_head is None:
                raise ValueError("shared_lm_head=True needs the target's lm_head")
            self._shared.append(base_lm_head)
            self.lm_heads = None
        else:
            self.lm_heads = nn.ModuleList(
                nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_heads)
            )
            if base_lm_head is not None:
                with torch.no_grad():
                    for head in self.lm_heads:
                        head.weight.copy_(base_lm_head.weight)

    @property
    def graph_safe(self) -> bool:
        """Can `specdec.graphs` capture these heads? Only our own tensor code, not a subclass's."""
        return type(self).forward is MedusaHeads.forward and type(self).first is MedusaHeads.first

    @property
    def projection_dtype(self) -> torch.dtype:
        """The dtype the vocabulary projections are stored and computed in (the target's, when shared)."""
        head = self._shared[0] if self.config.shared_lm_head else self.lm_heads[0]
        return head.weight.dtype

    def store_projections(self, dtype: torch.dtype) -> None:
        """Store the K projections in `dtype`; logits keep the blocks' dtype; shared heads are left alone."""
        # A draft's rounding changes what is proposed, never what is accepted: precision is a speed choice.
        if not self.config.shared_lm_head:
            with torch.inference_mode(False), torch.no_grad():  # parameters, never inference tensors
                self.lm_heads.to(dtype)

    def project(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Head k's vocabulary projection of x [..., H] -> [..., V], in x's dtype."""
        head = self._shared[0] if self.config.shared_lm_head else self.lm_heads[k]
        w = head.weight
        if w.dtype == x.dtype:
            return head(x)
        if w.dtype == torch.float16:  # fp16 has a narrow range: a huge activation or logit must not become NaN
            big = torch.finfo(torch.float16).max
            return torch.nan_to_num(head(x.clamp(-big, big).to(w.dtype)).to(x.dtype))
        return head(x.to(w.dtype)).to(x.dtype)

    def first(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """The first k heads' logits only (a cheap probe). [H] -> [k, V]"""
        if type(self).forward is not MedusaHeads.forward or self.config.shared_lm_head or k >= self.config.num_heads:
            return self(hidden)[:k]  # a subclass computes its own way; shared heads cost one pass anyway
        return self._run(hidden, k)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._run(hidden, self.config.num_heads)

    def head(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k alone on hidden [..., H] -> [..., V]: what training optimises."""
        return self.project(k, self.blocks[k](hidden))

    def _run(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Heads 0..k-1 on hidden [..., H] -> [k, ..., V], batched: on one row a call outweighs its maths."""
        x = self._blocks(hidden, k)  # [k, ..., H]
        if self.config.shared_lm_head:
            return self._shared[0](x)  # one pass over the shared vocabulary matrix, not K
        heads = self.lm_heads[:k]
        w = heads[0].weight
        if w.dtype == x.dtype:
            return torch.stack([head(x[i]) for i, head in enumerate(heads)])
        narrow = w.dtype == torch.float16  # fp16 has a narrow range: a huge activation or logit must not become NaN
        big = torch.finfo(torch.float16).max
        xin = (x.clamp(-big, big) if narrow else x).to(w.dtype)
        out = torch.stack([head(xin[i]) for i, head in enumerate(heads)]).to(x.dtype)
        return torch.nan_to_num(out) if narrow else out

    def _blocks(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """The first k heads' residual blocks on the same input: [..., H] -> [k, ..., H]."""
        if self.config.num_layers == 0:
            return hidden.expand(k, *hidden.shape)
        lin = [blocks[0].linear for blocks in self.blocks[:k]]
        # x + SiLU(W_i x + b_i) for every head i at once: [..., k*H] -> [k, ..., H] (one head: no copy)
        w, b = (lin[0].weight, lin[0].bias) if k == 1 else (torch.cat([m.weight for m in lin]),
                                                             torch.cat([m.bias for m in lin]))
        y = nn.functional.silu(nn.functional.linear(hidden, w, b))
        x = hidden + y.unflatten(-1, (k, hidden.shape[-1])).movedim(-2, 0)
        if self.config.num_layers == 1:
            return x
        out = []
        for xi, blocks in zip(x, self.blocks[:k]):
            for block in blocks[1:]:
                xi = block(xi)
            out.append(xi)
        return torch.stack(out)

    # -- persistence -------------------------------------------------------
    def save(self, directory: str | Path, tree_paths: list[tuple[int, ...]] | None = None,
             dtype: torch.dtype | None = None) -> None:
        """Write heads_config.json, heads.safetensors (in `dtype`, default: as trained) and tree.json."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = asdict(self.config)
        (d / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(d / WEIGHTS_NAME), metadata={"format": "pt"})
        if tree_paths is not None:
            (d / TREE_NAME).write_text(json.dumps({"paths": [list(p) for p in tree_paths]}) + "\n")


def load_heads(directory: str | Path, target: nn.Module, device=None, dtype=None) -> tuple[MedusaHeads, list[tuple[int, ...]] | None]:
    """Load heads saved by `MedusaHeads.save`; ValueError if missing, corrupt or trained for another model.

    Returns:
        (the heads, the tree shipped with them or None).
    """
    d = Path(directory)
    if not (d / CONFIG_NAME).is_file():
        raise ValueError(f"heads: no {CONFIG_NAME} in {str(d)!r}; expected a folder written by MedusaHeads.save")
    try:
        config = HeadsConfig(**json.loads((d / CONFIG_NAME).read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"heads: {d / CONFIG_NAME} is not a valid heads config ({e})") from e
    hidden, vocab = target_dims(target)
    if config.hidden_size != hidden or config.vocab_size != vocab:
        raise ValueError(
            f"heads in {str(d)!r} were trained for hidden_size={config.hidden_size}, vocab_size={config.vocab_size}, "
            f"but the model has hidden_size={hidden}, vocab_size={vocab}"
        )
    heads = MedusaHeads(config, target.get_output_embeddings())
    try:
        state = load_file(str(d / WEIGHTS_NAME))
    except (FileNotFoundError, SafetensorError, OSError) as e:
        raise ValueError(f"heads: cannot read {d / WEIGHTS_NAME} ({e})") from e
    try:
        heads.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as e:
        raise ValueError(f"heads: {d / WEIGHTS_NAME} does not match {CONFIG_NAME} ({e})") from e
    tree = None
    if (d / TREE_NAME).is_file():
        try:
            tree = [tuple(int(r) for r in p) for p in json.loads((d / TREE_NAME).read_text())["paths"]]
        except (KeyError, TypeError, ValueError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(f"heads: {d / TREE_NAME} is not a valid tree file ({e!r})") from e
    p = next(target.parameters())
    heads.to(device=device or p.device, dtype=dtype or p.dtype).eval()
    return heads, tree


def random_heads(target: nn.Module, num_heads: int = 4, num_layers: int = 1, seed: int = 0,
                 shared_lm_head: bool = True, scale: float = 0.5) -> MedusaHeads:
    """Seeded random heads for tests and untrained models, perturbed so they do not all copy the target."""
    hidden, vocab = target_dims(target)
    heads = MedusaHeads(HeadsConfig(hidden, vocab, num_heads, num_layers, shared_lm_head),
                        target.get_output_embeddings())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in heads.named_parameters():
            if "blocks" in name and prm.dim() == 2:
                prm.copy_(torch.randn(prm.shape, generator=g) * scale / prm.shape[1] ** 0.5)
    p = next(target.parameters())
    return heads.to(device=p.device, dtype=p.dtype).eval()


def target_dims(target: nn.Module) -> tuple[int, int]:
    """(hidden size, vocab size) as the lm_head sees them."""
    w = target.get_output_embeddings().weight  # [V, H]
    return int(w.shape[1]), int(w.shape[0])
