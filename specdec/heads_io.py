"""Draft heads on disk, in three layouts: specdec's own, FasterDecoding's Medusa, and vLLM's Medusa.

All three hold Medusa's head k, `lm_head_k(ResBlock^L(h))` predicting token t+k+2, under different key names.
Counts are read from the weights, never from a config, since published configs can disagree with their files;
a `.pt` file is a pickle, so it is read with `weights_only=True`.
"""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .draft_tree import MC_SIM_7B_63
from .heads import CONFIG_NAME, TREE_NAME, HeadsConfig, MedusaHeads, load_heads, target_dims

FORMATS = ("specdec", "medusa", "vllm")
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_WEIGHTS = "model.safetensors"

# Each layout's key names -> ("block", head, layer, "weight"|"bias") or ("proj", head).
_MEDUSA_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_MEDUSA_PROJ = re.compile(r"^(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_PROJ = re.compile(r"^lm_heads\.(\d+)\.weight$")
_PREFIXES = ("medusa_heads.", "medusa_head.", "model.")  # wrappers some exports put around the keys


def detect_format(directory: str | Path) -> str:
    """Which layout a heads folder holds, from its files. Raises ValueError naming what is missing."""
    d = Path(directory)
    if (d / CONFIG_NAME).is_file():
        return "specdec"
    config = _read_json(d / "config.json") if (d / "config.json").is_file() else {}
    if config.get("model_type") == "medusa" or "MedusaModel" in (config.get("architectures") or []):
        return "vllm"
    if any((d / f).is_file() for f in MEDUSA_FILES):
        return "medusa"
    if "medusa_num_heads" in config:
        raise ValueError(f"heads: {str(d)!r} has a Medusa config.json but no {' or '.join(MEDUSA_FILES)}; a Medusa-1.0 "
                         "repo that bundles the whole model is not a heads checkpoint")
    raise ValueError(f"heads: {str(d)!r} holds no heads checkpoint: expected {CONFIG_NAME} (specdec), "
                     f"{' or '.join(MEDUSA_FILES)} (FasterDecoding Medusa) or config.json with model_type 'medusa' "
                     "(vLLM)")


def read_heads(directory: str | Path, target: nn.Module | None = None) -> tuple[MedusaHeads, list | None, str]:
    """Load heads in any layout: (heads on the target's device and dtype, tree paths or None, layout).

    Args:
        target: None only for heads with their own vocabulary projections (an export).
    """
    d = Path(directory)
    fmt = detect_format(d)
    if fmt == "specdec":
        if target is None:
            return *_read_specdec_standalone(d), fmt
        heads, tree = load_heads(d, target)
        return heads, tree, fmt
    state = _medusa_state(d) if fmt == "medusa" else _vllm_state(d)
    heads = _heads_from_state(state, d, target, base_model=_read_json(d / "config.json").get(
        "base_model_name_or_path") if (d / "config.json").is_file() else None)
    tree = _read_tree(d)
    if tree is None and heads.config.num_heads == 5:
        tree = list(MC_SIM_7B_63)
    return heads, tree, fmt


def write_heads(heads: MedusaHeads, out: str | Path, fmt: str, tree=None, base_model: str | None = None,
                dtype: torch.dtype | None = None) -> Path:
    """Write heads in `fmt` ("specdec", "medusa" or "vllm") in `dtype` (default: as they are in memory).

    A shared projection is written once (vLLM's `original_lm_head`); Medusa's layout copies it into each head.
    """
    if fmt not in FORMATS:
        raise ValueError(f"`format` must be one of {FORMATS}, got {fmt!r}")
    d = Path(out)
    if fmt == "specdec":
        heads.save(d, list(tree) if tree else None, dtype)
        return d
    d.mkdir(parents=True, exist_ok=True)
    cfg = heads.config
    L = cfg.num_layers
    # one projection for every head (the target's, or equal copies read from such a layout): written once
    shared = cfg.shared_lm_head or all(torch.equal(heads.lm_heads[0].weight, p.weight) for p in heads.lm_heads)
    state: dict[str, torch.Tensor] = {}
    for h in range(cfg.num_heads):
        for l, block in enumerate(heads.blocks[h]):
            w, b = block.linear.weight, block.linear.bias
            if fmt == "medusa":
                state[f"{h}.{l}.linear.weight"], state[f"{h}.{l}.linear.bias"] = w, b
            else:
                state[f"blocks.{h}.layers.{l}.weight"], state[f"blocks.{h}.layers.{l}.bias"] = w, b
        proj = (heads._shared[0] if cfg.shared_lm_head else heads.lm_heads[h]).weight  # [V, H]
        if fmt == "medusa":
            state[f"{h}.{L}.weight"] = proj
        elif shared:
            state["lm_head.weight"] = proj
        else:
            state[f"lm_heads.{h}.weight"] = proj
    # safetensors refuses tensors that share memory (a shared projection), so every entry is its own copy.
    state = {k: v.detach().to(dtype or v.dtype).cpu().clone().contiguous() for k, v in state.items()}
    if fmt == "medusa":
        config = {"medusa_num_heads": cfg.num_heads, "medusa_num_layers": L,
                  "base_model_name_or_path": base_model or cfg.base_model, "hidden_size": cfg.hidden_size,
                  "vocab_size": cfg.vocab_size}
        save_file(state, str(d / MEDUSA_FILES[0]), metadata={"format": "pt"})
    else:
        config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": cfg.hidden_size,
                  "vocab_size": cfg.vocab_size, "truncated_vocab_size": cfg.vocab_size, "num_heads": cfg.num_heads,
                  "num_hidden_layers": L, "medusa_fc_bias": True, "original_lm_head": shared,
                  "logit_scale": 1.0}
        save_file(state, str(d / VLLM_WEIGHTS), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tree:  # specdec reads it back; vLLM and Medusa ignore it
        (d / TREE_NAME).write_text(json.dumps({"paths": [list(p) for p in tree]}) + "\n")
    return d


def stored_dtype(directory: str | Path) -> torch.dtype:
    """The dtype a heads folder stores its weights in (read from the file's header, not its tensors)."""
    d = Path(directory)
    fmt = detect_format(d)
    if fmt == "medusa" and (d / MEDUSA_FILES[1]).is_file() and not (d / MEDUSA_FILES[0]).is_file():
        return next(iter(_load_weights(d / MEDUSA_FILES[1]).values())).dtype
    path = d / {"specdec": "heads.safetensors", "medusa": MEDUSA_FILES[0], "vllm": VLLM_WEIGHTS}[fmt]
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            name = f.get_slice(next(iter(f.keys()))).get_dtype()  # "F16", "BF16", "F32"
    except (OSError, SafetensorError, StopIteration) as e:
        raise ValueError(f"heads: cannot read {path} ({e})") from e
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
    if name not in dtypes:
        raise ValueError(f"heads: {path} stores {name} weights; specdec reads F16, BF16, F32 or F64")
    return dtypes[name]


# -- reading ---------------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"heads: cannot read {path} ({e})") from e


def _read_tree(d: Path) -> list | None:
    if not (d / TREE_NAME).is_file():
        return None
    try:
        return [tuple(int(r) for r in p) for p in _read_json(d / TREE_NAME)["paths"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"heads: {d / TREE_NAME} is not a valid tree file ({e!r})") from e


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".pt":
            state = torch.load(path, map_location="cpu", weights_only=True)  # a pickle: tensors only
        else:
            state = load_file(str(path))
    except (OSError, SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"heads: cannot read {path} ({str(e).splitlines()[0]})") from e
    if not isinstance(state, dict):
        raise ValueError(f"heads: {path} holds a {type(state).__name__}, not a dict of tensors")
    out = {}
    for k, v in state.items():
        for p in _PREFIXES:
            if k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def _medusa_state(d: Path) -> dict[str, torch.Tensor]:
    """FasterDecoding keys -> specdec's MedusaHeads keys."""
    path = next(d / f for f in MEDUSA_FILES if (d / f).is_file())
    raw = _load_weights(path)
    out, used = {}, set()
    blocks = {k: m.groups() for k in raw if (m := _MEDUSA_BLOCK.match(k))}
    for k, (h, l, kind) in blocks.items():
        out[f"blocks.{h}.{l}.linear.{kind}"] = raw[k]
        used.add(k)
    for k in raw:
        if m := _MEDUSA_PROJ.match(k):  # `{h}.{L}.weight`: the projection after head h's L blocks
            h, idx = m.groups()
            n_blocks = sum(1 for hh, _, kind in blocks.values() if hh == h and kind == "weight")
            if int(idx) != n_blocks:
                raise ValueError(f"heads: {path} key {k!r}: head {h} has {n_blocks} blocks, so its projection "
                                 f"must be {h}.{n_blocks}.weight")
            out[f"lm_heads.{h}.weight"] = raw[k]
            used.add(k)
    _no_leftovers(raw, used, path)
    return out


def _vllm_state(d: Path) -> dict[str, torch.Tensor]:
    """vLLM keys -> specdec's MedusaHeads keys (`original_lm_head`: one projection for every head)."""
    config = _read_json(d / "config.json")
    vocab, truncated = config.get("vocab_size"), config.get("truncated_vocab_size")
    if truncated and vocab and truncated < vocab:
        raise ValueError(f"heads: {d} projects onto a truncated vocabulary ({truncated} of {vocab} tokens); "
                         "specdec needs heads over the full vocabulary")
    path = d / VLLM_WEIGHTS
    if not path.is_file():
        raise ValueError(f"heads: {d} has a vLLM Medusa config.json but no {VLLM_WEIGHTS}")
    raw = _load_weights(path)
    out, used = {}, set()
    for k, v in raw.items():
        if m := _VLLM_BLOCK.match(k):
            h, l, kind = m.groups()
            out[f"blocks.{h}.{l}.linear.{kind}"] = v
            used.add(k)
        elif _VLLM_PROJ.match(k):
            out[k] = v
            used.add(k)
    if config.get("original_lm_head") and "lm_head.weight" in raw:  # one projection shared by every head
        heads = {m.group(1) for k in out if (m := re.match(r"blocks\.(\d+)\.", k))}
        out.update({f"lm_heads.{h}.weight": raw["lm_head.weight"] for h in heads})
        used.add("lm_head.weight")
    if not config.get("medusa_fc_bias", False):  # vLLM's default: blocks without a bias
        for k in [k for k in out if k.endswith(".linear.weight")]:
            out.setdefault(k[: -len("weight")] + "bias", torch.zeros(out[k].shape[0], dtype=out[k].dtype))
    _no_leftovers(raw, used, path)
    return out


def _no_leftovers(raw: dict, used: set, path: Path) -> None:
    """A key the layout does not define means the file is not what we think it is: say so, don't drop it."""
    extra = sorted(set(raw) - used)
    if extra:
        raise ValueError(f"heads: {path} has keys this layout does not define: {extra[:5]}")


def _heads_from_state(state: dict[str, torch.Tensor], d: Path, target: nn.Module | None,
                      base_model: str | None) -> MedusaHeads:
    """Build MedusaHeads whose head and layer counts come from the weights themselves."""
    heads_ids = sorted({int(k.split(".")[1]) for k in state if k.startswith("lm_heads.")})
    if not heads_ids or heads_ids != list(range(len(heads_ids))):
        raise ValueError(f"heads: {d} has no vocabulary projections numbered 0..K-1 (found heads {heads_ids})")
    layers = [sorted({int(k.split(".")[2]) for k in state if k.startswith(f"blocks.{h}.") and k.endswith("weight")})
              for h in heads_ids]
    if any(ls != layers[0] for ls in layers) or layers[0] != list(range(len(layers[0]))):
        raise ValueError(f"heads: {d} has heads with different block counts ({[len(ls) for ls in layers]})")
    vocab, hidden = state["lm_heads.0.weight"].shape  # [V, H]
    if target is not None:
        t_hidden, t_vocab = target_dims(target)
        if (hidden, vocab) != (t_hidden, t_vocab):
            raise ValueError(f"heads in {str(d)!r} have hidden_size={hidden}, vocab_size={vocab}, but the model "
                             f"has hidden_size={t_hidden}, vocab_size={t_vocab}")
    config = HeadsConfig(int(hidden), int(vocab), len(heads_ids), len(layers[0]), False, base_model)
    heads = MedusaHeads(config)
    try:
        heads.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as e:
        raise ValueError(f"heads: the weights in {d} do not form Medusa heads ({e})") from e
    if target is not None:
        p = next(target.parameters())
        heads.to(device=p.device, dtype=p.dtype)
    return heads.eval()


def _read_specdec_standalone(d: Path) -> tuple[MedusaHeads, list | None]:
    """specdec heads without their target: possible only when each head has its own projection."""
    config = HeadsConfig(**_read_json(d / CONFIG_NAME))
    if config.shared_lm_head:
        raise ValueError(f"heads in {str(d)!r} share the target's lm_head: pass the model (--model) so it can be "
                         "copied into each head")
    heads = MedusaHeads(config)
    state = {k: v.float() for k, v in load_file(str(d / "heads.safetensors")).items()}
    heads.load_state_dict(state)
    return heads.eval(), _read_tree(d)
