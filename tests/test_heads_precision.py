"""The heads' vocabulary projections stored in half precision: a speed choice that never changes the output.

A head only proposes tokens, so its rounding may change what is drafted and accepted, never what is
emitted. These tests check the projections themselves (close to fp32, never NaN), the measured choice at
load, and that greedy decoding with half-precision heads still equals `model.generate` token for token.
"""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import make_model
from specdec.heads import random_heads


@pytest.fixture(scope="module")
def model():
    return make_model("llama", seed=0)


@pytest.fixture
def heads(model):
    return random_heads(model, num_heads=3, shared_lm_head=False, seed=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_projections_give_nearly_the_same_logits(model, heads, dtype):
    h = torch.randn(2, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = heads(h)
        heads.store_projections(dtype)
        got = heads(h)
        first = heads.first(h[0], 2)
    assert heads.projection_dtype == dtype
    assert heads.blocks[0][0].linear.weight.dtype == torch.float32  # the residual blocks stay as they were
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    torch.testing.assert_close(first, got[:2, 0])
    heads.store_projections(torch.float32)  # and back: a copy rounded once
    assert heads.projection_dtype == torch.float32


def test_fp16_projection_of_a_huge_activation_is_finite(model, heads):
    heads.store_projections(torch.float16)
    h = torch.full((model.config.hidden_size,), 1e9)  # beyond fp16's range, in and out
    with torch.inference_mode():
        out = heads(h)
    assert torch.isfinite(out).all()


def test_shared_heads_keep_the_target_lm_head(model):
    shared = random_heads(model, num_heads=2, shared_lm_head=True)
    shared.store_projections(torch.float16)
    assert shared.projection_dtype == torch.float32 == model.get_output_embeddings().weight.dtype


def test_load_takes_an_explicit_dtype_and_refuses_a_bad_one(model, heads):
    loaded = specdec.load(model, heads=heads, device="cpu", heads_dtype="bfloat16")
    assert loaded.heads.projection_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="heads_dtype"):
        specdec.load(model, heads=heads, device="cpu", heads_dtype="int8")
    with pytest.raises(ValueError, match="heads_dtype"):
        specdec.load(model, heads=heads, device="cpu", heads_dtype=torch.int8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_greedy_with_half_precision_heads_equals_generate(dtype):
    """The embedded model and its trained heads (which draft well, so many drafts are accepted)."""
    loaded = specdec.load(heads_dtype=dtype)
    assert loaded.heads.projection_dtype == getattr(torch, dtype)
    prompt = "def fibonacci(n):"
    ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out = specdec.generate(loaded, prompt_ids=ids, max_new_tokens=48, eos_token_id=None, lookup=0,
                           tree="default")  # a static tree: every round drafts
    with torch.inference_mode():
        ref = loaded.model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, min_new_tokens=48)
    assert out.token_ids == ref[0, len(ids):].tolist()
    assert out.stats["mean_accepted_length"] > 1.5  # the heads drafted, and the target accepted, in half precision
