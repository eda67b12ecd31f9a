"""specdec.heads_io: heads in specdec's, FasterDecoding's and vLLM's layouts, in and out.

The synthetic checkpoints are written here from the documented key names (the layouts table in
specdec/heads_io.py's docstring), with raw tensors: never through specdec's own writer. Their logits are checked against a
hand-written reference of Medusa's formula, head_k(h) = P_k (ResBlock^L(h)), ResBlock(x) = x + SiLU(Wx + b).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import specdec
from conftest import PROMPTS, hf_greedy, make_model
from specdec.__main__ import main as cli
from specdec.draft_tree import MC_SIM_7B_63
from specdec.heads import random_heads
from specdec.heads_io import detect_format, read_heads, write_heads

H, V = 32, 128  # the tiny llama's hidden and vocabulary sizes


def synthetic(num_heads: int, num_layers: int, bias: bool = True, seed: int = 0, H: int = H, V: int = V) -> dict:
    """Random Medusa weights as plain tensors: W[h][l] [H, H], b[h][l] [H], P[h] [V, H]."""
    g = torch.Generator().manual_seed(seed)
    return {
        "W": [[torch.randn(H, H, generator=g) * 0.3 for _ in range(num_layers)] for _ in range(num_heads)],
        "b": [[(torch.randn(H, generator=g) * 0.3 if bias else torch.zeros(H)) for _ in range(num_layers)]
              for _ in range(num_heads)],
        "P": [torch.randn(V, H, generator=g) for _ in range(num_heads)],
    }


def reference_logits(w: dict, h: torch.Tensor) -> torch.Tensor:
    """Medusa's formula written out: [H] -> [K, V]."""
    out = []
    for W, b, P in zip(w["W"], w["b"], w["P"]):
        x = h
        for Wl, bl in zip(W, b):
            x = x + torch.nn.functional.silu(Wl @ x + bl)
        out.append(P @ x)
    return torch.stack(out)


def write_fasterdecoding(d, w: dict, config_heads: int = 2, suffix: str = "safetensors") -> None:
    """FasterDecoding's layout: `{h}.{l}.linear.weight|bias`, `{h}.{L}.weight`. Its config undercounts the heads,
    as the published ones do (Medusa#114)."""
    d.mkdir(parents=True, exist_ok=True)
    L = len(w["W"][0])
    state = {}
    for h in range(len(w["P"])):
        for l in range(L):
            state[f"{h}.{l}.linear.weight"] = w["W"][h][l]
            state[f"{h}.{l}.linear.bias"] = w["b"][h][l]
        state[f"{h}.{L}.weight"] = w["P"][h]
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": config_heads, "medusa_num_layers": L,
                                               "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    if suffix == "pt":
        torch.save(state, d / "medusa_lm_head.pt")
    else:
        save_file(state, str(d / "medusa_lm_head.safetensors"))


def write_vllm(d, w: dict, bias: bool = True) -> None:
    """vLLM's layout: `blocks.{h}.layers.{l}.weight|bias`, `lm_heads.{h}.weight`, model_type "medusa"."""
    d.mkdir(parents=True, exist_ok=True)
    L = len(w["W"][0])
    state = {}
    for h in range(len(w["P"])):
        for l in range(L):
            state[f"blocks.{h}.layers.{l}.weight"] = w["W"][h][l]
            if bias:
                state[f"blocks.{h}.layers.{l}.bias"] = w["b"][h][l]
        state[f"lm_heads.{h}.weight"] = w["P"][h]
    (d / "config.json").write_text(json.dumps({"model_type": "medusa", "architectures": ["MedusaModel"],
                                               "hidden_size": H, "vocab_size": V, "num_heads": len(w["P"]),
                                               "num_hidden_layers": L, "medusa_fc_bias": bias}))
    save_file(state, str(d / "model.safetensors"))


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


def hidden_states(n: int = 5) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("suffix", ["safetensors", "pt"])
def test_fasterdecoding_checkpoint_gives_the_reference_logits(model, tmp_path, suffix):
    w = synthetic(num_heads=3, num_layers=2)
    write_fasterdecoding(tmp_path / "ckpt", w, config_heads=2, suffix=suffix)
    assert detect_format(tmp_path / "ckpt") == "medusa"
    loaded = specdec.load(model, heads=str(tmp_path / "ckpt"), heads_dtype="float32")
    assert loaded.heads.config.num_heads == 3  # from the weights, not the config's 2
    assert loaded.heads.config.num_layers == 2
    for h in hidden_states():
        torch.testing.assert_close(loaded.heads(h), reference_logits(w, h), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_vllm_checkpoint_gives_the_reference_logits(model, tmp_path, bias):
    w = synthetic(num_heads=4, num_layers=1, bias=bias)
    write_vllm(tmp_path / "ckpt", w, bias=bias)
    assert detect_format(tmp_path / "ckpt") == "vllm"
    loaded = specdec.load(model, heads=str(tmp_path / "ckpt"), heads_dtype="float32")
    assert (loaded.heads.config.num_heads, loaded.heads.config.num_layers) == (4, 1)
    for h in hidden_states():
        torch.testing.assert_close(loaded.heads(h), reference_logits(w, h), atol=1e-5, rtol=1e-5)


def test_five_head_medusa_checkpoint_runs_with_mc_sim_7b_63_and_stays_exact(model, tmp_path):
    write_fasterdecoding(tmp_path / "ckpt", synthetic(num_heads=5, num_layers=1))
    loaded = specdec.load(model, heads=str(tmp_path / "ckpt"), heads_dtype="float32")
    assert loaded.tree_paths == list(MC_SIM_7B_63)
    out = specdec.generate(loaded, prompt_ids=PROMPTS[1], max_new_tokens=24, eos_token_id=None, lookup=0,
                           tree="trained")
    assert len(out.rounds[1].nodes) == 64  # the 63-node tree plus the root (later rounds near the end are cut)
    assert out.token_ids == hf_greedy(model, PROMPTS[1], 24)


def test_heads_for_another_model_name_both_sizes(model, tmp_path):
    w = synthetic(num_heads=2, num_layers=1)
    w["P"] = [torch.randn(V + 4, H) for _ in range(2)]
    write_vllm(tmp_path / "ckpt", w)
    with pytest.raises(ValueError, match=rf"hidden_size={H}, vocab_size={V + 4}, but the model has "
                                         rf"hidden_size={H}, vocab_size={V}"):
        specdec.load(model, heads=str(tmp_path / "ckpt"), heads_dtype="float32")


def test_unknown_folders_keys_and_pickles_are_refused(model, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no heads checkpoint"):
        specdec.load(model, heads=str(tmp_path / "empty"), heads_dtype="float32")
    w = synthetic(num_heads=2, num_layers=1)
    write_fasterdecoding(tmp_path / "extra", w)
    state = {"0.0.linear.weight": w["W"][0][0], "0.0.linear.bias": w["b"][0][0], "0.1.weight": w["P"][0],
             "surprise": torch.zeros(3)}
    save_file(state, str(tmp_path / "extra" / "medusa_lm_head.safetensors"))
    with pytest.raises(ValueError, match="does not define.*surprise"):
        specdec.load(model, heads=str(tmp_path / "extra"), heads_dtype="float32")
    (tmp_path / "pickle").mkdir()
    torch.save({"0.1.weight": w["P"][0], "payload": Exception("not a tensor")}, tmp_path / "pickle" / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="cannot read"):  # weights_only refuses arbitrary objects
        specdec.load(model, heads=str(tmp_path / "pickle"), heads_dtype="float32")
    with pytest.raises(ValueError, match="does not exist"):
        specdec.load(model, heads=str(tmp_path / "missing" / "x"), heads_dtype="float32")


@pytest.mark.parametrize("fmt", ["vllm", "medusa", "specdec"])
@pytest.mark.parametrize("shared", [True, False])
def test_export_then_load_is_exact(model, tmp_path, fmt, shared):
    heads = random_heads(model, num_heads=3, num_layers=2, shared_lm_head=shared, seed=3)
    with torch.no_grad():  # give the biases something to carry
        for blk in heads.blocks:
            for res in blk:
                res.linear.bias.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    tree = [(0,), (1,), (0, 0), (0, 0, 0)]
    write_heads(heads, tmp_path / fmt, fmt, tree=tree)
    assert detect_format(tmp_path / fmt) == fmt
    back = specdec.load(model, heads=str(tmp_path / fmt), heads_dtype="float32")
    assert back.tree_paths == tree
    for k in range(3):  # every weight comes back bit for bit
        assert torch.equal(back.heads.project(k, torch.eye(H)), heads.project(k, torch.eye(H)))
        assert torch.equal(back.heads.blocks[k][1].linear.bias, heads.blocks[k][1].linear.bias)
    for h in hidden_states():
        if shared and fmt != "specdec":
            # A shared projection runs as one batched product and its per-head copies as K products:
            # the same numbers, summed in another order, so the last bit may differ.
            torch.testing.assert_close(back.heads(h), heads(h), atol=1e-6, rtol=1e-6)
        else:
            assert torch.equal(back.heads(h), heads(h))


def test_vllm_export_has_the_layout_vllm_loads(model, tmp_path):
    from safetensors import safe_open

    write_heads(random_heads(model, num_heads=2, num_layers=1, shared_lm_head=True), tmp_path, "vllm")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg["num_hidden_layers"]) == (H, V, 2, 1)
    assert cfg["medusa_fc_bias"] is True
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["blocks.0.layers.0.bias", "blocks.0.layers.0.weight", "blocks.1.layers.0.bias",
                                    "blocks.1.layers.0.weight", "lm_head.weight"]
        # the shared lm_head is written once, as vLLM's `original_lm_head`
        assert torch.equal(f.get_tensor("lm_head.weight"), model.get_output_embeddings().weight)
    assert cfg["original_lm_head"] is True
    own = random_heads(model, num_heads=2, num_layers=1, shared_lm_head=False)  # copies of lm_head, as trained
    with torch.no_grad():
        own.lm_heads[1].weight.add_(0.01)  # a trained head's own projection
    write_heads(own, tmp_path / "own", "vllm")
    assert json.loads((tmp_path / "own" / "config.json").read_text())["original_lm_head"] is False
    with safe_open(str(tmp_path / "own" / "model.safetensors"), "pt") as f:
        assert {"lm_heads.0.weight", "lm_heads.1.weight"} <= set(f.keys()) and "lm_head.weight" not in f.keys()


def test_export_heads_cli(model, tmp_path, capsys):
    model.save_pretrained(tmp_path / "model")
    random_heads(model, num_heads=2, shared_lm_head=True).save(tmp_path / "heads")
    # shared heads need the model to copy its lm_head from
    assert cli(["export-heads", "--heads", str(tmp_path / "heads"), "--format", "vllm", "--out", str(tmp_path / "x")]) == 2
    assert "--model" in capsys.readouterr().err
    assert cli(["export-heads", "--heads", str(tmp_path / "heads"), "--format", "medusa", "--out",
                str(tmp_path / "medusa"), "--model", str(tmp_path / "model")]) == 0
    heads, _, fmt = read_heads(tmp_path / "medusa")
    assert fmt == "medusa" and heads.config.num_heads == 2
    # and back again, from the exported (now self-contained) heads, without a model
    assert cli(["export-heads", "--heads", str(tmp_path / "medusa"), "--format", "vllm", "--out",
                str(tmp_path / "vllm")]) == 0
    assert detect_format(tmp_path / "vllm") == "vllm"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_export_heads_keeps_the_stored_dtype(model, tmp_path, dtype):
    from safetensors import safe_open

    model.save_pretrained(tmp_path / "model")
    random_heads(model, num_heads=2, shared_lm_head=False).save(tmp_path / "heads", dtype=dtype)
    assert cli(["export-heads", "--heads", str(tmp_path / "heads"), "--format", "vllm", "--out", str(tmp_path / "v")]) == 0
    with safe_open(str(tmp_path / "v" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}
    assert cli(["export-heads", "--heads", str(tmp_path / "v"), "--format", "medusa", "--out", str(tmp_path / "m"),
                "--dtype", "float32"]) == 0  # --dtype still chooses
    with safe_open(str(tmp_path / "m" / "medusa_lm_head.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
