"""EAGLE-3 checkpoints: SafeAILab's layout and speculators', written here from their documented key names,
load into drafters whose logits match a hand-written forward of the same tensors; exports reload bit for bit;
a drafter that does not fit its target is refused with both sides named."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec
from conftest import hf_greedy
from specdec.__main__ import main as cli
from specdec.eagle_io import detect, read_eagle, save_eagle
from test_eagle import reference_forward

H, NH, NKV, V, DV = 32, 4, 2, 128, 48  # the test llama: hidden 32, vocabulary 128; a 48-id draft vocabulary
TOKENS = [5, 9, 2, 77, 3, 3, 41]


def safeailab_state(seed: int = 0, embed: bool = False) -> dict[str, torch.Tensor]:
    """A random EAGLE-3 state dict under SafeAILab's names (no embed_tokens unless asked)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.2  # noqa: E731
    hd = H // NH
    used = torch.arange(DV) * 2 + 1  # draft id i is target id 2i + 1
    state = {
        "fc.weight": r(H, 3 * H),
        "midlayer.hidden_norm.weight": 1 + r(H), "midlayer.input_layernorm.weight": 1 + r(H),
        "midlayer.post_attention_layernorm.weight": 1 + r(H),
        "midlayer.self_attn.q_proj.weight": r(NH * hd, 2 * H), "midlayer.self_attn.k_proj.weight": r(NKV * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(NKV * hd, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, NH * hd),
        "midlayer.mlp.gate_proj.weight": r(64, H), "midlayer.mlp.up_proj.weight": r(64, H),
        "midlayer.mlp.down_proj.weight": r(H, 64),
        "norm.weight": 1 + r(H), "lm_head.weight": r(DV, H),
        "d2t": used - torch.arange(DV), "t2d": torch.zeros(V, dtype=torch.bool).index_fill_(0, used, True),
    }
    if embed:
        state["embed_tokens.weight"] = r(V, H)
    return state


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
                "intermediate_size": 64, "num_attention_heads": NH, "num_key_value_heads": NKV,
                "num_hidden_layers": 1, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": V,
                "draft_vocab_size": DV}


def write_safeailab(path, state, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**LLAMA_CONFIG, **config}))
    torch.save(state, path / "pytorch_model.bin")
    return path


def write_speculators(path, state):
    path.mkdir(parents=True, exist_ok=True)
    layer = {k: v for k, v in LLAMA_CONFIG.items() if k not in ("architectures", "draft_vocab_size")}
    (path / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "transformer_layer_config": layer,
        "draft_vocab_size": DV, "norm_before_residual": False, "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [1, 1, 2],
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                               "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}}}))
    save_file({(k.replace("midlayer.", "layers.0.", 1)): v.contiguous() for k, v in state.items()},
              str(path / "model.safetensors"))
    return path


def drafter_logits(d, feats):
    with torch.inference_mode():
        return d.step(torch.tensor(TOKENS), d.fuse(feats), torch.arange(len(TOKENS)), None)[1].double()


@pytest.fixture(scope="module")
def feats():
    return torch.randn(len(TOKENS), 3 * H, generator=torch.Generator().manual_seed(9))


def test_safeailab_layout_loads_and_matches_its_tensors(tmp_path, llama, feats):
    state = safeailab_state()
    folder = write_safeailab(tmp_path / "eagle", state)
    assert detect(folder) == "eagle3"
    loaded = specdec.load(llama, heads=str(folder), device="cpu")
    d = loaded.eagle
    assert d is not None and loaded.heads is None and loaded.engine.default_drafter == "eagle3"
    assert d.config.layers == (1, 1, 1)  # a 2-layer target: (2, L // 2, L - 3) spread within it
    want = reference_forward(state, llama.get_input_embeddings().weight, TOKENS, feats, NH, NKV, 1e-5, 10000.0)
    assert torch.allclose(drafter_logits(d, feats), want, atol=1e-4)
    ids = d.to_target(torch.arange(DV))
    assert ids.tolist() == (torch.arange(DV) * 2 + 1).tolist()
    prompt = [1, 2, 3, 4, 5]
    r = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=16, temperature=0.0, eos_token_id=None, lookup=0)
    assert r.token_ids == hf_greedy(llama, prompt, 16)
    assert {n.source for e in r.rounds for n in e.nodes} <= {"root", "eagle3"}
    assert all(n.token_id % 2 == 1 for e in r.rounds for n in e.nodes if n.source == "eagle3")


def test_a_checkpoint_with_its_own_embeddings_uses_them(tmp_path, llama, feats):
    state = safeailab_state(embed=True)
    d, _, _ = read_eagle(write_safeailab(tmp_path / "own", state), llama)
    want = reference_forward(state, state["embed_tokens.weight"], TOKENS, feats, NH, NKV, 1e-5, 10000.0)
    assert torch.allclose(drafter_logits(d, feats), want, atol=1e-4)


def test_speculators_layout_is_the_same_drafter(tmp_path, llama, feats):
    state = safeailab_state()
    a, _, _ = read_eagle(write_safeailab(tmp_path / "a", state), llama)
    folder = write_speculators(tmp_path / "b", state)
    assert detect(folder) == "speculators"
    b, _, fmt = read_eagle(folder, llama)
    assert fmt == "speculators" and b.config.layers == (1, 1, 2)
    assert torch.equal(drafter_logits(a, feats), drafter_logits(b, feats))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["norm_before_residual"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="norm_before_residual"):
        read_eagle(folder, llama)


def test_exports_reload_bit_for_bit(tmp_path, llama, feats):
    state = safeailab_state()
    src = write_safeailab(tmp_path / "src", state)
    assert cli(["export-heads", "--heads", str(src), "--format", "speculators", "--out", str(tmp_path / "spec"),
                "--model", "unused-not-read"]) == 2  # a model that does not exist is refused, not guessed
    assert cli(["export-heads", "--heads", str(src), "--format", "speculators", "--out", str(tmp_path / "spec")]) == 0
    assert cli(["export-heads", "--heads", str(tmp_path / "spec"), "--format", "eagle3",
                "--out", str(tmp_path / "back")]) == 0
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["norm_before_residual"] is False
    a, _, _ = read_eagle(src, llama)
    b, _, _ = read_eagle(tmp_path / "back", llama)
    assert torch.equal(drafter_logits(a, feats), drafter_logits(b, feats))
    # Medusa formats are not an EAGLE-3 drafter's, and the other way round.
    assert cli(["export-heads", "--heads", str(src), "--format", "vllm", "--out", str(tmp_path / "x")]) == 2


def test_a_drafter_trained_here_round_trips(tmp_path, llama, feats):
    from test_eagle import random_eagle

    d = random_eagle(llama, seed=3, draft_vocab=40)
    save_eagle(d, tmp_path / "mine")
    e, shape, _ = read_eagle(tmp_path / "mine", llama)
    assert e.config == d.config or e.config.layers == d.config.layers
    assert torch.equal(drafter_logits(d, feats), drafter_logits(e, feats))


@pytest.mark.parametrize("change, match", [
    (lambda s, c: s.update({"fc.weight": torch.zeros(H, 3 * 16)}), r"fuses states of width 16.*hidden size is 32"),
    (lambda s, c: s.update({"t2d": torch.zeros(256, dtype=torch.bool)}), r"vocabulary of 256 tokens, the target has 128"),
    (lambda s, c: c.update({"draft_vocab_size": 64}), r"lm_head has 48 rows, its draft_vocab_size is 64"),
    (lambda s, c: s.pop("midlayer.mlp.up_proj.weight"), r"missing \['midlayer.mlp.up_proj.weight'\]"),
    (lambda s, c: s.pop("d2t"), r"no d2t map"),
])
def test_a_drafter_that_does_not_fit_is_refused_naming_both_sides(tmp_path, llama, change, match):
    state, config = safeailab_state(), {}
    change(state, config)
    folder = write_safeailab(tmp_path / "bad", state, **config)
    with pytest.raises(ValueError, match=match):
        specdec.load(llama, heads=str(folder), device="cpu")


def test_a_pickle_that_is_more_than_tensors_is_refused(tmp_path, llama):
    folder = write_safeailab(tmp_path / "evil", safeailab_state())
    torch.save({"fc.weight": torch.zeros(1), "payload": object()}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="holds more than tensors"):
        read_eagle(folder, llama)


def test_shipped_drafter_names_are_for_the_embedded_model(llama):
    with pytest.raises(ValueError, match="shipped with the embedded model"):
        specdec.load(llama, heads="eagle3", device="cpu")
