"""specdec.packed: the target's rows through oneDNN with a prepacked lm_head, exact where it must be."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import ARCHS, PROMPTS, hf_greedy
from specdec import packed
from specdec.target import TargetModel

pytestmark = pytest.mark.skipif(not packed.available(torch.nn.Linear(4, 8)), reason="this PyTorch has no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
def test_the_packed_product_is_the_linear_product(bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 300, bias=bias)
    proj = packed.PackedProjection(lin)
    for m in (1, 2, 3, 5, 16, 40):
        x = torch.randn(m, 48)
        got = proj(x)
        assert got.shape == (m, 300) and got.dtype == torch.float32
        torch.testing.assert_close(got, torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)


def test_a_changed_weight_is_packed_again():
    """The packed copy follows in-place updates and replaced tensors; a stale copy would give the old product."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(32, 64, bias=False)
    proj = packed.PackedProjection(lin)
    x = torch.randn(4, 32)
    before = proj(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)  # in place: the version moves
    after = proj(x)
    torch.testing.assert_close(after, 2 * before, atol=1e-4, rtol=1e-5)
    lin.weight = torch.nn.Parameter(torch.randn(64, 32))  # a new tensor: the pointer moves
    torch.testing.assert_close(proj(x), x @ lin.weight.T, atol=1e-4, rtol=1e-5)


def test_only_fp32_cpu_linears_are_packed():
    assert packed.available(torch.nn.Linear(4, 8))
    assert not packed.available(torch.nn.Linear(4, 8).half())
    assert not packed.available(torch.nn.Embedding(8, 4))
    with pytest.raises(ValueError, match="fp32 nn.Linear"):
        packed.PackedProjection(torch.nn.Linear(4, 8).to(torch.bfloat16))


@pytest.mark.parametrize("arch", ARCHS)
def test_one_row_stays_on_the_models_lm_head_and_several_go_packed(arch, models, monkeypatch):
    target = TargetModel(models[arch])
    assert target.use_packed_rows(True)
    calls = []
    real = packed.PackedProjection.__call__
    monkeypatch.setattr(packed.PackedProjection, "__call__", lambda self, x: calls.append(x.shape[0]) or real(self, x))
    h = torch.randn(6, target.hidden_size)
    lm_head = models[arch].get_output_embeddings()
    with torch.inference_mode():
        own, one, first = lm_head(h).float(), lm_head(h[0]).float(), lm_head(h[:1]).float()
    # plain decoding's single row: bit for bit what the model (and HF's generate) computes
    assert torch.equal(target.logits(h[0]), one) and torch.equal(target.logits(h[:1]), first)
    assert calls == []
    torch.testing.assert_close(target.logits(h), own, atol=1e-4, rtol=1e-5)
    assert calls == [6]
    assert not target.use_packed_rows(False) and target.packed_rows is None


def test_a_speculative_requests_one_row_rounds_read_the_packed_copy_and_plain_decodings_do_not(models, monkeypatch):
    """One copy of the lm_head for every round of a speculative request (drafted or not); plain decoding
    keeps the model's own head, so its logits stay HF's bit for bit."""
    loaded = specdec.load(models["llama"], heads="random", device="cpu", packed_rows=True)
    target = loaded.engine.target
    h = torch.randn(3, target.hidden_size)
    with torch.inference_mode():
        one = target.lm_head(h[0]).float()
        torch.testing.assert_close(target.logits(h[0], pack_one=True), one, atol=1e-4, rtol=1e-5)  # [H] -> [V]
        torch.testing.assert_close(target.logits(h[:1], pack_one=True), one[None], atol=1e-4, rtol=1e-5)
    calls = []
    real = packed.PackedProjection.__call__
    monkeypatch.setattr(packed.PackedProjection, "__call__", lambda self, x: calls.append(x.shape[0]) or real(self, x))
    prompt = PROMPTS[0]
    plain = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=8, speculative=False, eos_token_id=None)
    assert calls == [], "plain decoding reads its rows from the model's own lm_head"
    # prompt lookup alone on a prompt with no repeats: every round is a one-row round of a speculative request
    spec = specdec.generate(loaded, prompt_ids=list(range(5, 25)), max_new_tokens=8, tree="none", lookup=4,
                            eos_token_id=None)
    assert calls and set(calls) >= {1}, f"its one-row rounds go through the packed copy, got {calls}"
    assert plain.token_ids == hf_greedy(models["llama"], prompt, 8)
    assert spec.token_ids == hf_greedy(models["llama"], list(range(5, 25)), 8)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree,lookup", [("default", 0), ("auto", 10)])
def test_greedy_with_packed_rows_equals_hf_generate(arch, models, tree, lookup):
    loaded = specdec.load(models[arch], heads="random", device="cpu", packed_rows=True)
    assert loaded.engine.target.packed_rows is not None
    for prompt in PROMPTS:
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=24, tree=tree, lookup=lookup,
                               eos_token_id=None)
        assert out.token_ids == hf_greedy(models[arch], prompt, 24)


def test_load_pins_or_refuses_packed_rows(models):
    assert specdec.load(models["llama"], heads=None, packed_rows=False).engine.target.packed_rows is None
    assert specdec.load(models["llama"], heads=None, packed_rows=True).engine.target.packed_rows is not None
    with pytest.raises(ValueError, match="`packed_rows` must be None, True or False"):
        specdec.load(models["llama"], heads=None, packed_rows="yes")


def test_the_load_time_choice_skips_small_heads_and_measures_large_ones(models, monkeypatch):
    from conftest import make_model
    from specdec import cost

    timed = []
    real = cost._timed
    monkeypatch.setattr(cost, "_timed", lambda fn: timed.append(1) or real(fn))
    assert cost.packed_rows_pay(TargetModel(models["llama"])) is False  # 128 x 32 weights: not worth a measurement
    assert timed == []
    big = TargetModel(make_model("llama", vocab=8192))  # 8192 x 32 = 2**18 weights: measured
    assert isinstance(cost.packed_rows_pay(big, reps=2), bool) and len(timed) >= 4
