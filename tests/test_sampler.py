"""specdec.sampler against a float64 reference written here, plus input validation."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import reference_probs
from specdec.sampler import SamplingParams, filter_logits, filter_stages, sample, target_probs

NEG = float("-inf")


def random_rows(n: int, V: int, seed: int, scale: float = 3.0, with_inf: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, V, generator=g) * scale
    if with_inf:
        drop = torch.rand(n, V, generator=g) < 0.3
        drop[:, 0] = False  # keep at least one finite entry per row
        x = x.masked_fill(drop, NEG)
    return x


CASES = [
    # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0),  # no filter
    (0.7, 0, 1.0, 0.0),  # temperature only
    (2.5, 0, 1.0, 0.0),
    (1.0, 5, 1.0, 0.0),  # top-k only
    (1.0, 1, 1.0, 0.0),
    (1.0, 0, 0.8, 0.0),  # top-p only
    (1.0, 0, 0.3, 0.0),
    (1.0, 0, 1e-6, 0.0),
    (1.0, 0, 1.0, 0.1),  # min-p only
    (1.0, 0, 1.0, 1.0),
    (0.8, 10, 0.9, 0.05),  # composition
    (1.3, 4, 0.5, 0.2),
    (0.5, 20, 0.95, 0.01),
    (1.0, 50, 1.0, 0.0),  # top_k == V: off
    (1.0, 500, 1.0, 0.0),  # top_k > V: off
    (1.0, 0, 1.0, 0.0),  # top_p = 1 and min_p = 0: off
]


@pytest.mark.parametrize("with_inf", [False, True], ids=["finite", "with_-inf"])
@pytest.mark.parametrize("temperature,top_k,top_p,min_p", CASES)
def test_target_probs_match_float64_reference(temperature, top_k, top_p, min_p, with_inf):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = random_rows(40, 50, seed=hash((temperature, top_k, top_p, min_p, with_inf)) % 2**31, with_inf=with_inf)
    got = target_probs(rows, params)  # batched [40, V]
    assert got.dtype == torch.float32 and got.shape == rows.shape
    checked = 0
    for i in range(rows.shape[0]):
        want, margin = reference_probs(rows[i], temperature, top_k, top_p, min_p)
        if margin < 1e-4:
            continue  # a float32 rounding could flip this decision either way
        checked += 1
        torch.testing.assert_close(got[i].double(), want, atol=1e-6, rtol=1e-5)
        # the same row alone gives the same answer as in a batch
        torch.testing.assert_close(target_probs(rows[i], params), got[i], atol=1e-7, rtol=0)
    assert checked >= 30


def test_filters_actually_cut():
    """Guard against a reference and sampler that both do nothing."""
    row = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    assert (target_probs(row, SamplingParams(temperature=1.0, top_k=2)) > 0).sum() == 2
    # probs ~ [.634, .233, .086, .032, .012, .004]: 0.85 needs the top 2, 0.9 the top 3
    assert (target_probs(row, SamplingParams(temperature=1.0, top_p=0.85)) > 0).sum() == 2
    assert (target_probs(row, SamplingParams(temperature=1.0, top_p=0.9)) > 0).sum() == 3
    # min_p 0.1 keeps p >= 0.064: the top 3
    assert (target_probs(row, SamplingParams(temperature=1.0, min_p=0.1)) > 0).sum() == 3
    assert [(reference_probs(row, 1.0, 0, tp, 0.0)[0] > 0).sum().item() for tp in (0.85, 0.9)] == [2, 3]
    assert (reference_probs(row, 1.0, 2, 1.0, 0.0)[0] > 0).sum() == 2
    assert (reference_probs(row, 1.0, 0, 1.0, 0.1)[0] > 0).sum() == 3


def test_filter_order_is_temperature_topk_topp_minp():
    """top-p after top-k works on the renormalised top-k law (HF order), not the raw one."""
    row = torch.tensor([2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3])
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.6)
    kept = (target_probs(row, params) > 0).nonzero().flatten().tolist()
    # after top-3 the law is ~[.37, .33, .30]: 0.6 needs 2 tokens; on the raw law it would need 5
    assert kept == [0, 1]
    # a temperature change alters which tokens top-p keeps
    hot = SamplingParams(temperature=10.0, top_p=0.3)
    cold = SamplingParams(temperature=0.1, top_p=0.3)
    assert (target_probs(row, hot) > 0).sum() > (target_probs(row, cold) > 0).sum() == 1


def test_top_k_keeps_ties_like_hf():
    row = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0])
    p = target_probs(row, SamplingParams(temperature=1.0, top_k=2))
    assert p.tolist() == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3, 0.0])


@pytest.mark.parametrize("temperature", [1e-6, 1e-4])
def test_tiny_temperature_is_argmax_without_nan(temperature):
    rows = random_rows(20, 64, seed=3, scale=30.0, with_inf=True)
    for top_k, top_p, min_p in [(0, 1.0, 0.0), (5, 0.9, 0.1)]:
        p = target_probs(rows, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
        assert torch.isfinite(p).all()
        assert torch.equal(p.argmax(-1), rows.argmax(-1))
        torch.testing.assert_close(p.amax(-1), torch.ones(20))


def test_rows_with_inf_never_gain_mass():
    rows = random_rows(30, 40, seed=4, with_inf=True)
    for params in [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=3, top_p=0.9, min_p=0.1)]:
        p = target_probs(rows, params)
        assert (p[torch.isinf(rows)] == 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(30))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=1, top_p=1e-9, min_p=1.0),
    SamplingParams(temperature=1e-6, top_k=1, top_p=1e-9, min_p=1.0),
    SamplingParams(temperature=100.0, top_p=1e-9),
    SamplingParams(temperature=1.0, min_p=1.0),
])
def test_filters_never_leave_empty_support(params):
    rows = torch.cat([
        random_rows(20, 30, seed=5, with_inf=True),
        torch.full((1, 30), 7.0),  # all tied
        torch.tensor([[NEG] * 29 + [0.0]]),  # a single finite entry, at the end
        torch.tensor([[-1e30] * 15 + [1e30] * 15]),  # huge magnitudes
    ])
    p = target_probs(rows, params)
    assert torch.isfinite(p).all()
    assert ((p > 0).sum(-1) >= 1).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(rows.shape[0]))
    assert p[21].argmax() == 29


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_gives_float32(dtype):
    rows = random_rows(8, 32, seed=6).to(dtype)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05)
    assert filter_logits(rows, params).dtype == torch.float32
    p = target_probs(rows, params)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p.sum(-1), torch.ones(8))
    # same as filtering the upcast logits: the maths ran in float32
    torch.testing.assert_close(p, target_probs(rows.float(), params))
    assert target_probs(rows, SamplingParams()).dtype == torch.float32  # greedy one-hot too


def test_pure_function_does_not_mutate_input():
    rows = random_rows(4, 16, seed=7, with_inf=True)
    before = rows.clone()
    target_probs(rows, SamplingParams(temperature=0.5, top_k=3, top_p=0.5, min_p=0.2))
    filter_logits(rows, SamplingParams(temperature=2.0, top_k=3))
    assert torch.equal(rows, before)


def test_greedy_is_one_hot_argmax():
    rows = random_rows(10, 20, seed=8, with_inf=True)
    p = target_probs(rows, SamplingParams(temperature=0.0))
    assert torch.equal(p, torch.nn.functional.one_hot(rows.argmax(-1), 20).float())


def test_sample_is_seeded_and_follows_p():
    from scipy.stats import chisquare

    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.95, min_p=0.05)
    p = target_probs(row, params)
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    a = [sample(p, g1) for _ in range(50)]
    b = [sample(p, g2) for _ in range(50)]
    assert a == b
    g = torch.Generator().manual_seed(12)
    n = 4000
    draws = torch.tensor([sample(p, g) for _ in range(n)])
    counts = torch.bincount(draws, minlength=6).double()
    support = p > 0
    assert counts[~support].sum() == 0
    expected = p[support].double() / p[support].double().sum() * n
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-4


def test_filter_stages_reports_the_removing_filter():
    row = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    rows = filter_stages(row, SamplingParams(temperature=1.0, top_k=4, top_p=0.85, min_p=0.5), top=6)
    by_id = {r["token_id"]: r for r in rows}
    # top-4 keeps 0..3; top-p 0.85 on [.64, .24, .09, .03] keeps 0, 1; min-p 0.5 on [.73, .27] keeps 0
    assert [by_id[i]["removed_by"] for i in range(6)] == [None, "min_p", "top_p", "top_p", "top_k", "top_k"]
    assert by_id[0]["filtered_prob"] == pytest.approx(1.0)
    assert sum(r["filtered_prob"] for r in rows) == pytest.approx(1.0)


# -- validation ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=-0.2), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=-0.01), "min_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(seed=-1), "seed"),
])
def test_invalid_params_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`") as e:
        SamplingParams(**kwargs)
    assert repr(list(kwargs.values())[0]) in str(e.value) or "nan" in str(e.value)


EDGE_ROW = torch.tensor([2.0, 1.0, 1.0, 0.5, -1.0, -3.0])  # token 0 on top, tokens 1 and 2 tied


@pytest.mark.parametrize("kwargs,kept", [
    (dict(top_k=0), 6), (dict(top_p=1.0), 6), (dict(min_p=0.0), 6),  # each filter's "off" value keeps everything
    (dict(min_p=1.0), 1), (dict(top_p=1e-9), 1),  # the strictest values still keep the top token
    (dict(top_k=2), 3),  # ties with the k-th are kept
])
def test_edge_values_are_accepted_and_do_what_they_say(kwargs, kept):
    params = SamplingParams(temperature=1.0, **kwargs)
    p = target_probs(EDGE_ROW, params)
    assert int((p > 0).sum()) == kept and p[0] == p.max()
    if kept == 6:  # off means off: the law is the plain softmax
        torch.testing.assert_close(p, torch.softmax(EDGE_ROW, -1))


def test_temperature_edges():
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams(temperature=1e-6).greedy
    assert target_probs(EDGE_ROW, SamplingParams(temperature=1e-6))[0] == 1.0  # the limit is the argmax...
    torch.testing.assert_close(target_probs(EDGE_ROW, SamplingParams()),  # ...which temperature 0 is exactly
                               target_probs(EDGE_ROW, SamplingParams(temperature=1e-6)))


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=-3), "top_k"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=2.0), "min_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-5), "max_new_tokens"),
])
def test_generate_rejects_bad_settings(loaded_llama, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        specdec.generate(loaded_llama, prompt_ids=[1, 2, 3], **kwargs)


@pytest.mark.parametrize("speculative", [True, False])
def test_generate_rejects_bad_prompts(loaded_llama, speculative):
    V = loaded_llama.engine.target.vocab_size
    limit = loaded_llama.engine.target.max_length
    with pytest.raises(ValueError, match="empty"):
        specdec.generate(loaded_llama, prompt_ids=[], speculative=speculative)
    with pytest.raises(ValueError, match="empty"):
        specdec.generate(loaded_llama, prompt="", speculative=speculative)
    with pytest.raises(ValueError, match="empty"):
        specdec.generate(loaded_llama, speculative=speculative)
    for bad in ([1, V], [-1, 2], [V + 100]):
        with pytest.raises(ValueError, match="vocabulary"):
            specdec.generate(loaded_llama, prompt_ids=bad, speculative=speculative)
    with pytest.raises(ValueError, match="context"):
        specdec.generate(loaded_llama, prompt_ids=[1] * limit, speculative=speculative)
    with pytest.raises(ValueError, match="context"):
        specdec.generate(loaded_llama, prompt_ids=[1] * (limit + 50), speculative=speculative)
    # the longest legal prompt still works and respects the context
    out = specdec.generate(loaded_llama, prompt_ids=[1] * (limit - 1), max_new_tokens=5, speculative=speculative)
    assert 1 <= len(out.token_ids) <= 5


@pytest.mark.parametrize("V,scale", [(4096, 0.05), (4096, 8.0), (32000, 3.5), (32000, 6.0)])
def test_fast_top_p_equals_full_sort(V, scale):
    """The top-k prefix shortcut keeps exactly the tokens a full sort keeps (flat laws take the fallback)."""
    import specdec.sampler as sampler_mod
    g = torch.Generator().manual_seed(0)
    prefix_used = 0
    for trial in range(30):
        x = torch.randn(3, V, generator=g) * scale
        lse = torch.logsumexp(x, -1, keepdim=True)
        for top_p in (0.5, 0.9, 0.99):
            fast = sampler_mod._top_p(x, top_p)
            order = torch.sort(x, dim=-1, descending=True)
            probs = (order.values - lse).exp()
            keep_sorted = (torch.cumsum(probs, -1) - probs) < top_p
            keep = torch.zeros_like(keep_sorted).scatter(-1, order.indices, keep_sorted)
            assert torch.equal(torch.isfinite(fast), keep), (V, scale, trial, top_p)
            top = probs[..., : sampler_mod._TOP_P_PREFIX]
            prefix_used += bool(((torch.cumsum(top, -1) - top)[..., -1] >= top_p).all())
    if scale >= 3.5:  # peaked laws: the shortcut itself must have been exercised
        assert prefix_used > 0


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
                                    SamplingParams(temperature=0.5, top_p=0.9), SamplingParams(temperature=1, min_p=0.1)])
def test_plus_inf_logits_take_all_the_mass_without_nan(params):
    """An fp16 overflow gives +inf logits. Their limit law shares all the mass among them,
    where a naive softmax gives NaN (inf - inf)."""
    logits = torch.randn(64)
    logits[7] = float("inf")
    p = target_probs(logits, params)
    assert not torch.isnan(p).any()
    assert p[7] == 1.0
    logits[9] = float("inf")
    p = target_probs(logits, params)
    assert p[7] == p[9] == 0.5 and p.sum() == 1.0
    g = torch.Generator().manual_seed(0)
    assert {sample(p, g) for _ in range(50)} == {7, 9}
    rows = filter_stages(logits, params)
    assert not any(r["prob"] != r["prob"] or r["filtered_prob"] != r["filtered_prob"] for r in rows)


def test_all_minus_inf_logits_raise_clearly():
    with pytest.raises(ValueError, match="-inf for every token"):
        target_probs(torch.full((8,), float("-inf")), SamplingParams(temperature=1.0))


def test_greedy_verification_of_overflowed_rows_has_finite_probabilities():
    from specdec.draft_tree import build_tree
    from specdec.sampler import finite_logits
    from specdec.verifier import verify_greedy

    tree = build_tree(((0,), (0, 0)))
    logits = torch.randn(3, 16)
    logits[0, 4] = float("inf")  # the target is certain of token 4 after the root
    logits = finite_logits(logits)  # what TargetModel.logits hands the verifier
    v = verify_greedy([1, 4, 5], tree, logits)
    assert v.accepted[:2] == (0, 1) and v.target_prob[1] == 1.0
    assert all(p == p for p in v.target_prob.values()) and v.next_prob == v.next_prob


def _inverse_cdf_ignoring_the_total(probs, generator):
    """A planted bug: the uniform is not scaled by the law's total (right only for a normalised law)."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    u = torch.rand(1, generator=generator, dtype=torch.float64)
    return int(torch.searchsorted(cdf, u, right=True).clamp_max(probs.shape[-1] - 1).item())


@pytest.mark.parametrize("bug", [False, True])
def test_sample_follows_an_unnormalised_law_with_zeros(bug):
    """`sample` draws p / sum(p) exactly (chi-square), never a zero-mass token, and the test catches a
    sampler that ignores the total (the residual law after rejections is passed unnormalised)."""
    from scipy.stats import chisquare

    p = torch.tensor([0.0, 0.3, 0.0, 0.1, 0.5, 0.0, 0.6, 0.0])  # sums to 1.5, zeros at both ends
    draw = _inverse_cdf_ignoring_the_total if bug else sample
    g = torch.Generator().manual_seed(5)
    n = 6000
    counts = torch.bincount(torch.tensor([draw(p, g) for _ in range(n)]), minlength=8).double()
    support = p > 0
    expected = p[support].double() / p[support].double().sum() * n
    pvalue = chisquare(counts[support].numpy(), expected.numpy()).pvalue
    if bug:
        assert pvalue < 1e-6
    else:
        assert counts[~support].sum() == 0
        assert pvalue > 1e-3


def test_sample_is_seeded_and_takes_the_only_token_of_a_one_token_law():
    p = torch.zeros(4096)
    p[4095] = 1e-30  # the last token, with a mass near float32's floor
    assert sample(p, torch.Generator().manual_seed(0)) == 4095
    row = torch.randn(4096, generator=torch.Generator().manual_seed(1)).softmax(-1)
    a = [sample(row, g) for g in [torch.Generator().manual_seed(3)] for _ in range(20)]
    b = [sample(row, g) for g in [torch.Generator().manual_seed(3)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize("bad", ["zeros", "nan"])
def test_sample_refuses_a_law_without_mass(bad):
    """A law with no mass (or NaN) has no token to draw: an error, never an index past the vocabulary."""
    p = torch.zeros(16) if bad == "zeros" else torch.full((16,), float("nan"))
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(p, torch.Generator().manual_seed(0))
