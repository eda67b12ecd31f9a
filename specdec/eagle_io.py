"""EAGLE-3 drafters on disk: SafeAILab's layout (which vLLM and SGLang load) and vLLM's `speculators` layout.

specdec writes the first by default, so what it trains is what vLLM and SGLang serve. A `.bin` file is a
pickle, so it is read with `weights_only=True`; shapes are checked against the target before anything runs.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .eagle import Eagle3, EagleConfig, Shape, default_layers

FORMATS = ("eagle3", "speculators")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_PREFIXES = ("model.", "eagle.", "draft_model.")


def detect(directory: str | Path) -> str | None:
    """"eagle3" or "speculators" when the folder holds an EAGLE-3 drafter, else None."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    archs = " ".join(config.get("architectures") or [])
    if "draft_vocab_size" in config or "Eagle3" in archs:
        return "eagle3"
    return None


def save_eagle(d: Eagle3, directory: str | Path, shape: Shape | None = None, dtype: torch.dtype | None = None,
               layout: str = "eagle3") -> Path:
    """Write the drafter (config.json, model.safetensors) in `layout`, in `dtype` (default: as held)."""
    if layout not in FORMATS:
        raise ValueError(f"`layout` must be one of {FORMATS}, got {layout!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    c = d.config
    default = c.layers is None or c.layers == default_layers_of(c)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size, "hidden_act": c.hidden_act, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.feature_size,
        "tie_word_embeddings": False, "torch_dtype": str(dtype or d.fc.weight.dtype).replace("torch.", ""),
        "specdec": {"tree": asdict(shape or Shape()), "base_model": c.base_model,
                    "layers": list(c.layers) if c.layers else None,
                    "target_layers": c.target_layers},
    }
    if not default:  # vLLM reads explicit ids as HF's; the default (2, L // 2, L - 3) is every engine's own
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(c.layers)}
    if layout == "speculators":
        config = _speculators_config(config, c, shape or Shape())
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {}
    for k, v in d.state_dict().items():
        if k.startswith("rotary."):
            continue
        k = "embed_tokens.weight" if k == "own_embed.weight" else k
        if layout == "speculators" and k.startswith("midlayer."):
            k = "layers.0." + k[len("midlayer."):]
        v = v.detach().cpu()
        state[k] = (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
    save_file(state, str(out / "model.safetensors"))
    return out


def default_layers_of(c: EagleConfig) -> tuple[int, ...] | None:
    """The layers every engine taps by default for this drafter's target, when specdec knows its depth."""
    return None if c.target_layers is None else default_layers(c.target_layers)


def _speculators_config(config: dict, c: EagleConfig, shape: Shape) -> dict:
    layer = {k: v for k, v in config.items() if k not in ("architectures", "draft_vocab_size", "target_hidden_size",
                                                          "eagle_config", "specdec")}
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": {**layer, "attention_bias": False, "mlp_bias": False},
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.feature_size,
        "norm_before_residual": False,  # SafeAILab's residual (vLLM assumes True where the key is absent)
        "eagle_aux_hidden_state_layer_ids": list(c.layers) if c.layers else None,  # null: the engine's default
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": shape.depth,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": c.base_model or "", "architectures": []}},
        "specdec": config["specdec"],
    }


def read_eagle(directory: str | Path, target: nn.Module | None) -> tuple[Eagle3, Shape, str]:
    """Read an EAGLE-3 drafter in either layout: (drafter on the target's device and dtype, shape, layout).

    Args:
        target: None for an export: nothing is checked, and only the checkpoint's own embedding table is used.
    """
    d = Path(directory)
    fmt = detect(d)
    if fmt is None:
        raise ValueError(f"heads: {str(d)!r} holds no EAGLE-3 drafter (config.json with draft_vocab_size or "
                         "speculators_model_type 'eagle3')")
    config = json.loads((d / "config.json").read_text())
    state = _state(d)
    if fmt == "speculators":
        layer = config.get("transformer_layer_config") or {}
        unsupported = [k for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output") if config.get(k)]
        if unsupported:
            raise ValueError(f"heads: {str(d)!r} is a speculators EAGLE-3 drafter with {', '.join(unsupported)} set; "
                             "specdec runs SafeAILab's layer (residual before hidden_norm, no extra norms)")
        config = {**layer, **{k: v for k, v in config.items() if k != "transformer_layer_config"}}
        state = {(k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k): v for k, v in state.items()}
    cfg = _config(config, state, target, d)
    drafter = Eagle3(cfg, target.get_input_embeddings() if target is not None else None)
    if "embed_tokens.weight" in state:  # its own table; else the target's
        w = state.pop("embed_tokens.weight")
        drafter.own_embed = nn.Embedding(w.shape[0], w.shape[1])
        with torch.no_grad():
            drafter.own_embed.weight.copy_(w)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.") and k not in ("d2t", "t2d", "own_embed.weight")]
    if missing or unexpected:
        raise ValueError(f"heads: {str(d)!r} is an EAGLE-3 checkpoint whose weights do not fit its config: "
                         f"missing {missing[:6]}, unexpected {unexpected[:6]}")
    if "d2t" not in state and cfg.draft_vocab_size != cfg.vocab_size:
        raise ValueError(f"heads: {str(d)!r} has a draft vocabulary of {cfg.draft_vocab_size} ids and no d2t map "
                         f"to the target's {cfg.vocab_size}")
    shape = Shape(**((config.get("specdec") or {}).get("tree") or {}))
    if target is None:
        return drafter.eval(), shape, fmt
    p = next(target.parameters())
    return drafter.to(p.device, p.dtype).eval(), shape, fmt


def _state(d: Path) -> dict[str, torch.Tensor]:
    if (d / "model.safetensors").is_file():
        try:
            state = load_file(str(d / "model.safetensors"))
        except SafetensorError as e:
            raise ValueError(f"heads: {str(d / 'model.safetensors')!r} is not a readable safetensors file ({e})") from e
    elif (d / "pytorch_model.bin").is_file():
        import pickle

        try:
            state = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            raise ValueError(f"heads: {str(d / 'pytorch_model.bin')!r} holds more than tensors or is damaged ({e}); "
                             "only plain state dicts are read") from e
    else:
        raise ValueError(f"heads: {str(d)!r} has an EAGLE-3 config.json but no {' or '.join(WEIGHT_FILES)}")
    out = {}
    for k, v in state.items():
        for pre in _PREFIXES:
            if k.startswith(pre) and not k.startswith("midlayer."):
                k = k[len(pre):]
                break
        out[k] = v
    return out


def _config(config: dict, state: dict, target: nn.Module | None, where: Path) -> EagleConfig:
    fc = state.get("fc.weight")
    lm = state.get("lm_head.weight")
    if fc is None or lm is None:
        raise ValueError(f"heads: {str(where)!r} is an EAGLE-3 checkpoint without fc.weight or lm_head.weight")
    H = int(config.get("hidden_size") or fc.shape[0])
    feature = int(config.get("target_hidden_size") or H)
    V = int(config.get("target_vocab_size") or config.get("vocab_size") or lm.shape[0])
    if "t2d" in state:
        V = int(state["t2d"].shape[0])
    spec = config.get("specdec") or {}
    if target is None:  # an export: the checkpoint's own figures
        V_t, H_t, L_t = V, feature, spec.get("target_layers")
    else:
        tcfg = target.config
        V_t, H_t, L_t = int(tcfg.vocab_size), int(tcfg.hidden_size), int(tcfg.num_hidden_layers)
    if fc.shape[1] != 3 * H_t:
        raise ValueError(f"heads: the EAGLE-3 drafter fuses states of width {fc.shape[1] // 3} (fc.weight "
                         f"{list(fc.shape)}), but the target's hidden size is {H_t}")
    if feature != H_t:
        raise ValueError(f"heads: the EAGLE-3 drafter's target_hidden_size is {feature}, the target's hidden size {H_t}")
    if V != V_t:
        raise ValueError(f"heads: the EAGLE-3 drafter was made for a vocabulary of {V} tokens, the target has {V_t}")
    draft_vocab = int(config.get("draft_vocab_size") or lm.shape[0])
    if lm.shape[0] != draft_vocab:
        raise ValueError(f"heads: the EAGLE-3 drafter's lm_head has {lm.shape[0]} rows, its draft_vocab_size is "
                         f"{draft_vocab}")
    if "embed_tokens.weight" not in state and H != H_t:
        raise ValueError(f"heads: the EAGLE-3 drafter's hidden size is {H} and it has no embed_tokens, so it reads "
                         f"the target's embeddings, of width {H_t}")
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or H // heads)
    eagle_cfg = config.get("eagle_config") or {}
    layers = eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    layers = layers or spec.get("layers")
    if layers:
        layers = tuple(int(i) for i in layers)
    elif L_t is not None:
        layers = default_layers(L_t)
    else:  # an export of a checkpoint that leaves the layers to each engine's default: so does the export
        layers = None
    if layers is not None and len(layers) != 3:
        raise ValueError(f"heads: the EAGLE-3 drafter reads {len(layers)} target layers ({list(layers)}); it fuses 3")
    rope = config.get("rope_scaling")
    return EagleConfig(hidden_size=H, num_attention_heads=heads,
                       num_key_value_heads=int(config.get("num_key_value_heads") or heads), head_dim=head_dim,
                       intermediate_size=int(config.get("intermediate_size") or state["midlayer.mlp.gate_proj.weight"].shape[0]),
                       vocab_size=V, draft_vocab_size=draft_vocab, layers=layers,
                       target_hidden_size=feature if feature != H else None,
                       rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                       rope_theta=float(config.get("rope_theta", 10000.0)),
                       rope_scaling=rope if isinstance(rope, dict) else None,
                       max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
                       hidden_act=str(config.get("hidden_act", "silu")), base_model=spec.get("base_model"),
                       target_layers=L_t)
