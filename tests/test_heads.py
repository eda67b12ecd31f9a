"""specdec.heads: structure, initialisation, persistence and load errors."""
from __future__ import annotations

import json

import pytest
import torch

import specdec
from conftest import make_model
from specdec.heads import CONFIG_NAME, TREE_NAME, WEIGHTS_NAME, HeadsConfig, MedusaHeads, ResBlock, load_heads, \
    random_heads, target_dims

H, V = 32, 128


def config(**kw) -> HeadsConfig:
    return HeadsConfig(**{"hidden_size": H, "vocab_size": V, **kw})


def test_blocks_are_distinct_modules(llama):
    heads = MedusaHeads(config(num_heads=4, num_layers=3), llama.get_output_embeddings())
    blocks = [b for seq in heads.blocks for b in seq]
    assert len(blocks) == 12 and all(isinstance(b, ResBlock) for b in blocks)
    assert len({id(b) for b in blocks}) == 12
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs)), "two parameters share storage"
    # 12 blocks x (H*H + H) + 4 own lm_heads x V*H
    assert sum(p.numel() for p in heads.parameters()) == 12 * (H * H + H) + 4 * V * H
    # training one block must not move another
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.add_(1.0)
    assert heads.blocks[1][0].linear.weight.abs().sum() == 0
    assert heads.blocks[0][1].linear.weight.abs().sum() == 0


def test_zero_init_is_identity(llama):
    heads = MedusaHeads(config(num_heads=3, num_layers=2), llama.get_output_embeddings())
    x = torch.randn(5, H)
    for seq in heads.blocks:
        torch.testing.assert_close(seq(x), x, atol=0, rtol=0)
    out = heads(x)  # [K, 5, V]
    assert out.shape == (3, 5, V)
    base = llama.get_output_embeddings()(x)
    for k in range(3):
        torch.testing.assert_close(out[k], base, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layers", [0, 1, 3])
@pytest.mark.parametrize("projection", [torch.float32, torch.float16])
def test_heads_share_calls_but_each_computes_its_own(llama, layers, projection):
    """The heads' batched blocks and projections give each head what its own modules give, one at a time."""
    torch.manual_seed(layers)
    heads = MedusaHeads(config(num_heads=4, num_layers=layers), llama.get_output_embeddings())
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))  # every block and head different, none the identity
    heads.store_projections(projection)
    for x in (torch.randn(H), torch.randn(5, H)):
        want = torch.stack([heads.project(k, heads.blocks[k](x)) for k in range(4)])  # [4, ..., V]
        torch.testing.assert_close(heads(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(heads.first(x, 2), want[:2], atol=1e-5, rtol=1e-5)
        if layers:  # the comparison can fail: head 0 through head 1's blocks is another head
            assert not torch.allclose(heads(x)[0], heads.project(0, heads.blocks[1](x)), atol=1e-3)


def test_own_lm_head_is_a_copy_of_the_base(llama):
    base = llama.get_output_embeddings()
    heads = MedusaHeads(config(num_heads=2), base)
    for head in heads.lm_heads:
        assert torch.equal(head.weight, base.weight)
        assert head.weight.data_ptr() != base.weight.data_ptr()
    with torch.no_grad():
        heads.lm_heads[0].weight.add_(1.0)
    assert not torch.equal(heads.lm_heads[0].weight, base.weight)
    assert torch.equal(heads.lm_heads[1].weight, base.weight)


def test_shared_lm_head_option(llama):
    base = llama.get_output_embeddings()
    heads = MedusaHeads(config(num_heads=3, shared_lm_head=True), base)
    assert heads.lm_heads is None
    assert all("lm_head" not in k for k in heads.state_dict())  # the base weights are not saved again
    assert sum(p.numel() for p in heads.parameters()) == 3 * (H * H + H)
    x = torch.randn(H)
    torch.testing.assert_close(heads(x)[1], base(x), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="lm_head"):
        MedusaHeads(config(shared_lm_head=True), None)


def test_invalid_head_counts_raise():
    with pytest.raises(ValueError, match="num_heads"):
        MedusaHeads(config(num_heads=0))


def test_random_heads_are_seeded_and_not_identity(llama):
    a, b, c = random_heads(llama, seed=0), random_heads(llama, seed=0), random_heads(llama, seed=1)
    x = torch.randn(H)
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    assert not torch.allclose(a(x), c(x))
    assert not torch.allclose(a(x)[0], llama.get_output_embeddings()(x))
    assert not torch.allclose(a(x)[0], a(x)[1])
    assert target_dims(llama) == (H, V)


@pytest.mark.parametrize("shared", [False, True])
def test_save_load_round_trip(llama, tmp_path, shared):
    heads = random_heads(llama, num_heads=3, num_layers=2, seed=5, shared_lm_head=shared)
    if not shared:  # give the own lm_heads their own values too
        with torch.no_grad():
            for i, head in enumerate(heads.lm_heads):
                head.weight.add_(0.01 * (i + 1))
    tree = [(0,), (1,), (0, 0)]
    heads.save(tmp_path, tree_paths=tree)
    assert {p.name for p in tmp_path.iterdir()} == {CONFIG_NAME, WEIGHTS_NAME, TREE_NAME}
    assert json.loads((tmp_path / CONFIG_NAME).read_text())["num_heads"] == 3
    loaded, loaded_tree = load_heads(tmp_path, llama)
    assert loaded.config == heads.config
    assert loaded_tree == tree
    assert set(loaded.state_dict()) == set(heads.state_dict())
    for k, v in heads.state_dict().items():
        # the file stores float16 (see test_save_load_is_exact_in_float32 below)
        torch.testing.assert_close(loaded.state_dict()[k], v, atol=1e-3, rtol=1e-3)
    x = torch.randn(4, H)
    torch.testing.assert_close(loaded(x), heads(x), atol=5e-3, rtol=1e-3)
    assert not loaded.training

    # through the public API: the tree shipped with the heads becomes tree="trained"
    out = specdec.load(llama, heads=str(tmp_path), device="cpu")
    assert out.tree_paths == tree
    assert out.engine.resolve_tree("trained").paths == ((), (0,), (1,), (0, 0))


def test_save_load_is_exact_in_float32(llama, tmp_path):
    heads = random_heads(llama, num_heads=2, seed=7, shared_lm_head=False)
    heads.save(tmp_path)
    loaded, _ = load_heads(tmp_path, llama)
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_load_missing_folder_raises(llama, tmp_path):
    with pytest.raises(ValueError, match=CONFIG_NAME):
        load_heads(tmp_path / "nope", llama)
    with pytest.raises(ValueError, match="does not exist"):
        specdec.load(llama, heads=str(tmp_path / "nope"))


def test_load_missing_weights_raises(llama, tmp_path):
    random_heads(llama).save(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(ValueError, match=WEIGHTS_NAME):
        load_heads(tmp_path, llama)


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated"])
def test_load_corrupt_weights_raises(llama, tmp_path, damage):
    random_heads(llama).save(tmp_path)
    f = tmp_path / WEIGHTS_NAME
    data = f.read_bytes()
    f.write_bytes({"garbage": b"\x00not a safetensors file" * 10, "empty": b"",
                   "truncated": data[: len(data) // 2]}[damage])
    with pytest.raises(ValueError, match="cannot read"):
        load_heads(tmp_path, llama)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"hidden_size": 32}',
                                  '{"hidden_size": 32, "vocab_size": 128, "color": 1}'])
def test_load_corrupt_config_raises(llama, tmp_path, text):
    random_heads(llama).save(tmp_path)
    (tmp_path / CONFIG_NAME).write_text(text)
    with pytest.raises(ValueError, match="not a valid heads config"):
        load_heads(tmp_path, llama)


def test_load_weights_not_matching_config_raises(llama, tmp_path):
    random_heads(llama, num_heads=4).save(tmp_path)
    cfg = json.loads((tmp_path / CONFIG_NAME).read_text())
    cfg["num_heads"] = 2
    (tmp_path / CONFIG_NAME).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match"):
        load_heads(tmp_path, llama)


@pytest.mark.parametrize("other", [dict(hidden=48), dict(vocab=100)])
def test_load_for_another_model_raises(tmp_path, other):
    src = make_model("llama")
    dst = make_model("llama", vocab=other.get("vocab", 128)) if "vocab" in other else None
    if "hidden" in other:
        from transformers import LlamaConfig, LlamaForCausalLM
        dst = LlamaForCausalLM(LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
    random_heads(src).save(tmp_path)
    name = "hidden_size" if "hidden" in other else "vocab_size"
    with pytest.raises(ValueError, match=f"trained for .*{name}") as e:
        load_heads(tmp_path, dst)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(ValueError, match=name):
        specdec.load(dst, heads=str(tmp_path))


@pytest.mark.parametrize("text", ["{bad", '{"paths": 5}'])
def test_load_corrupt_tree_json_raises_clearly(llama, tmp_path, text):
    random_heads(llama).save(tmp_path, tree_paths=[(0,)])
    (tmp_path / TREE_NAME).write_text(text)
    with pytest.raises(ValueError, match=TREE_NAME):
        load_heads(tmp_path, llama)


def test_heads_object_is_moved_to_the_models_device_and_dtype():
    """A MedusaHeads built elsewhere (fp32 here) follows the model (bf16 here) at load."""
    model = make_model("llama").to(torch.bfloat16)
    heads = MedusaHeads(HeadsConfig(32, 128, num_heads=2))
    loaded = specdec.load(model, heads=heads)
    assert {p.dtype for p in loaded.heads.parameters()} == {torch.bfloat16}
    assert loaded.engine.heads is loaded.heads
    out = specdec.generate(loaded, prompt_ids=[1, 2, 3], max_new_tokens=8, tree="chain", lookup=0)
    assert len(out.token_ids) == 8


