"""Smoke test for bench.py: its core on a tiny random model, on the CPU, in a few seconds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench  # noqa: E402

pytestmark = pytest.mark.bench  # deselected by the quick loop (-m "not slow"); CI runs it

METHOD_KEYS = {"id", "label", "backend", "sampling", "tree", "tree_nodes", "tok_s_median", "tok_s_runs",
               "new_tokens", "mean_accepted_length", "acceptance_per_depth", "acceptance_per_depth_conditional",
               "ms_per_token_p50", "ms_per_token_p99", "ttft_ms_median", "peak_mem_mb", "speedup_vs_hf_greedy",
               "speedup_vs_plain", "efficiency"}


def tiny_config(**kw) -> bench.BenchConfig:
    base = dict(model="random:tiny", heads="random", device="cpu", dtype="float32",
                prompts=bench.DEFAULT_PROMPTS[:2], max_new_tokens=12, repeats=1, warmup=0, threads=1)
    return bench.BenchConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return bench.load_target(tiny_config())


@pytest.fixture(scope="module")
def result(tiny):
    loaded, oracle = tiny
    methods = ("hf_greedy", "hf_sample", "hf_prompt_lookup", "plain_greedy", "chain_greedy", "default_greedy",
               "auto_greedy", "default_sample", "auto_sample", "lookup_greedy", "merge_greedy", "hybrid_greedy",
               "hybrid_sample", "hf_sample_t1", "plain_sample_t1", "auto_sample_t1")
    return bench.benchmark(tiny_config(methods=methods), loaded, oracle, log=lambda *a: None)


def test_structure(result):
    assert set(result) == {"meta", "methods", "targets"}
    ids = [r["id"] for r in result["methods"]]
    assert ids == ["hf_greedy", "hf_sample", "hf_sample_t1", "hf_prompt_lookup", "plain_greedy", "plain_sample_t1",
                   "chain_greedy", "default_greedy", "auto_greedy", "default_sample", "auto_sample", "auto_sample_t1",
                   "lookup_greedy", "merge_greedy", "hybrid_greedy", "hybrid_sample"]
    for r in result["methods"]:
        assert METHOD_KEYS <= set(r), METHOD_KEYS - set(r)
        assert r["tok_s_median"] > 0 and r["new_tokens"] == 2 * 12
        assert r["ms_per_token_p50"] <= r["ms_per_token_p99"]
    rows = {r["id"]: r for r in result["methods"]}
    assert rows["hf_greedy"]["speedup_vs_hf_greedy"] == pytest.approx(1.0)
    assert rows["hf_greedy"]["mean_accepted_length"] == pytest.approx(1.0)
    assert rows["plain_greedy"]["mean_accepted_length"] == pytest.approx(1.0)
    spec = rows["default_greedy"]
    assert spec["tree_nodes"] == 64 and 1.0 <= spec["mean_accepted_length"] <= 5.0
    assert len(spec["acceptance_per_depth"]) == 4
    assert all(0.0 <= a <= 1.0 for a in spec["acceptance_per_depth"])
    # accepting >= d drafts gets rarer with d
    assert spec["acceptance_per_depth"] == sorted(spec["acceptance_per_depth"], reverse=True)
    # the dynamic tree reports its size and how far its expectation was off; static trees have no expectation
    auto = rows["auto_greedy"]
    assert auto["tree_nodes"] is None and auto["mean_tree_nodes"] >= 1 and auto["expected_length_mae"] >= 0
    assert spec["expected_length_mae"] is None and 1 < spec["mean_tree_nodes"] <= 64  # cut near max_new_tokens
    # T = 1.0 rows compare with plain decoding at T = 1.0, not at the run's temperature
    assert tuple(rows["auto_sample_t1"]["temperature_top_p"]) == (1.0, 1.0)
    assert rows["auto_sample_t1"]["speedup_vs_plain"] == pytest.approx(
        rows["auto_sample_t1"]["tok_s_median"] / rows["plain_sample_t1"]["tok_s_median"])
    names = [t["name"] for t in result["targets"]]
    assert any(n.startswith("dynamic tree greedy / best static preset greedy") for n in names)
    assert "forward" in result["meta"]["cost_model_ms"]
    assert set(spec["stage_ms_per_round"]) == set(bench.STAGES) | {"total"}
    assert 0 < spec["non_forward_pct"] < 100
    from bench.methods import VERSUS_STATIC
    ratios = {name for name, a, b, _ in bench.TARGETS if a in rows and b in rows}
    versus = {t["name"] for t in result["targets"]} - ratios
    assert ratios <= {t["name"] for t in result["targets"]}
    assert len(versus) == len(VERSUS_STATIC) and all(any(n.startswith(v[0]) for v in VERSUS_STATIC) for n in versus)
    assert rows["lookup_greedy"]["tree_nodes"] == 1 and rows["lookup_greedy"]["lookup"] == 10
    assert rows["merge_greedy"]["lookup_mode"] == "merge" and rows["hybrid_greedy"]["lookup_mode"] == "first"
    json.dumps(result)  # plain values only


def test_greedy_matches_hf(result):
    """In fp32 on the CPU every greedy method reproduces HF greedy exactly, ids and text."""
    for r in result["methods"]:
        if r["sampling"]:
            assert "greedy_check" not in r
            continue
        g = r["greedy_check"]
        assert g == {"runs": 2, "tokens_equal": 2, "first_mismatch": None, "text_equal": 2}, r["id"]
        assert r["greedy_equal"] is True


def test_reports(result, tmp_path):
    paths = bench.write_reports(result, tmp_path)
    assert json.loads(paths["json"].read_text())["methods"][0]["id"] == "hf_greedy"
    md = paths["markdown"].read_text()
    assert "| default_greedy (64 nodes) |" in md and "| target | measured |" in md
    assert "| auto_sample_t1 (tree auto, T=1 top-p=1) |" in md
    html = paths["html"].read_text()
    assert html.count("plotly-graph-div") >= 4 and "Acceptance per depth" in html


def test_oracle_accepts_known_fraction(tiny):
    """An oracle with accuracy 1 makes the chain accept every draft: tau = depth + 1."""
    loaded, _ = tiny
    oracle = bench.OracleHeads(loaded.model, accuracy=1.0)
    import specdec

    lo = specdec.load(loaded.model, oracle, "cpu", torch.float32, tokenizer=loaded.tokenizer)
    cfg = tiny_config(heads="oracle:1.0", methods=("hf_greedy", "chain_greedy"), max_new_tokens=21)
    res = bench.benchmark(cfg, lo, oracle, log=lambda *a: None)
    chain = {r["id"]: r for r in res["methods"]}["chain_greedy"]
    assert chain["greedy_equal"]
    assert chain["mean_accepted_length"] == pytest.approx(5.0)  # 1 + 20 tokens in 4 rounds of 5
    assert chain["acceptance_per_depth"] == [1.0, 1.0, 1.0, 1.0]


def test_the_oracle_ranks_the_truth_first_in_bf16_over_a_large_vocabulary():
    """bf16 steps by 0.0625 at 10: over Qwen2's 151,936 tokens its top ~475 scores tie, and top-k would
    return low ids instead of the truth (tau 1.00 on the GPU script). The scores stay float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=151936)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    ref = [5, 151000, 7, 150999, 11, 149000, 13, 150001]
    oracle = bench.OracleHeads(model, ref, num_heads=4)
    h = model.base_model(torch.tensor([ref[:2]])).last_hidden_state[0, -1]  # the hidden state at position 1
    scores = oracle(h)
    assert scores.dtype == torch.float32
    assert scores.topk(1, dim=-1).indices[:, 0].tolist() == ref[3:7]  # head k: the token at 1 + k + 2


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown method"):
        bench.select_methods(("nope",), has_heads=True, has_trained_tree=False)
    with pytest.raises(ValueError, match="accuracy"):
        bench.OracleHeads(bench.random_model("tiny", "cpu", torch.float32, vocab_size=64), accuracy=1.5)


def test_partial_results_after_each_repeat(tiny, tmp_path):
    """A run cut short (a GPU lease's time limit) still leaves the finished repeats on disk."""
    loaded, oracle = tiny
    seen = []
    cfg = tiny_config(methods=("hf_greedy", "plain_greedy", "lookup_greedy"), repeats=3)
    full = bench.benchmark(cfg, loaded, oracle, log=lambda *a: None,
                           checkpoint=lambda r: (seen.append(r), bench.write_reports(r, tmp_path)))
    assert [r["meta"]["partial"] for r in seen] == ["1 of 3 repeats", "2 of 3 repeats", "3 of 3 repeats"]
    assert all(len(row["tok_s_runs"]) == i + 1 for i, r in enumerate(seen) for row in r["methods"])
    assert "PARTIAL" in (tmp_path / "results.md").read_text()
    assert "partial" not in full["meta"] and len(full["methods"][0]["tok_s_runs"]) == 3
