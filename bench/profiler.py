"""`bench.py --profile`: the round loop per stage for the default drafting and each tree, then a cProfile of the default."""
from __future__ import annotations

import cProfile
import pstats
from dataclasses import replace
from pathlib import Path

import torch

from .config import BenchConfig
from .methods import BY_ID
from .models import load_target
from .runners import STAGES, run_engine
from .suite import benchmark


def profile(cfg: BenchConfig, log=print) -> dict:
    """Round-loop breakdown per method from the events' timings, then a cProfile of the default drafting
    (the dynamic tree with prompt lookup in its budget: what `specdec.generate` does)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loaded, oracle = load_target(cfg)
    if loaded.heads is None:
        raise ValueError("--profile needs draft heads")
    trees = [t for t in ("chain", "small", "default", "trained") if t != "trained" or loaded.tree_paths]
    cfg = replace(cfg, methods=("plain_greedy", "hybrid_greedy", "auto_greedy", "lookup_greedy")
                  + tuple(f"{t}_greedy" for t in trees), repeats=max(cfg.repeats, 3))
    res = benchmark(cfg, loaded, oracle, log=log)
    rows = [r for r in res["methods"] if r["backend"] == "engine"]
    log("\nround-loop breakdown, greedy: ms per decoding round (% of round), least disturbed repeat")
    log(f"{'stage':<8}" + "".join(f"{r['id']:>20}" for r in rows))
    for s in STAGES + ("total",):
        cells = [f"{r['stage_ms_per_round_best_repeat'][s]:.2f} ({100 * r['stage_ms_per_round_best_repeat'][s] / r['stage_ms_per_round_best_repeat']['total']:.0f}%)"
                 for r in rows]
        log(f"{s:<8}" + "".join(f"{c:>20}" for c in cells))
    best = [r["stage_ms_per_round_best_repeat"] for r in rows]
    log(f"{'non-fwd':<8}" + "".join(f"{100 * (b['total'] - b['forward']) / b['total']:>19.1f}%" for b in best)
        + "   (the target for the default, hybrid_greedy: <= 20%)")
    log(f"{'all reps':<8}" + "".join(f"{r['non_forward_pct']:>19.1f}%" for r in rows) + "   (non-fwd, every repeat)")
    log(f"{'non-model':<8}" + "".join(f"{100 * (b['total'] - b['forward'] - b['rows']) / b['total']:>19.1f}%"
                                     for b in best) + "   (outside forward and rows: the engine's own share)")
    log(f"{'outside':<8}" + "".join(f"{r['outside_round_ms_per_call']:>17.2f} ms" for r in rows)
        + "   per call: generator, callbacks, API")
    log("draft = heads + top-k fill | forward = target forward incl. the 4D mask | rows = the target's vocabulary "
        "projection of the rows verification reads | verify = "
        "acceptance | cache = KV gather | event = detok + EOS/length cut | other = tree-node list "
        "(between the engine's clocks)")

    # cProfile: the same loop, function by function.
    m = BY_ID["hybrid_greedy"]
    tok = loaded.tokenizer
    ids = tok(cfg.prompts[0], add_special_tokens=False)["input_ids"] if tok is not None else [1, 2, 3, 4]
    run_engine(loaded, ids, m, cfg, cfg.seed, cfg.max_new_tokens, oracle)
    prof = cProfile.Profile()
    prof.enable()
    runs = [run_engine(loaded, ids, m, cfg, cfg.seed, cfg.max_new_tokens, oracle) for _ in range(3)]
    prof.disable()
    st = pstats.Stats(prof)
    rounds = sum(r.rounds + 1 for r in runs)
    log(f"\ncProfile, default drafting (hybrid_greedy), 3 x {cfg.max_new_tokens} tokens, {rounds} target forwards "
        f"({st.total_tt:.2f}s under the profiler, which inflates Python-heavy code):")
    entries = [(ct, tt, nc, f"{Path(f).parent.name}/{Path(f).name}:{ln}({fn})") for (f, ln, fn), (_, nc, tt, ct, _)
               in st.stats.items()]
    keep = ("specdec/", "masking_utils", "cache_utils", "_nn.linear", "scaled_dot_product", "modeling_llama.py",
            "modeling_qwen2.py", "softmax", "topk", "argmax")
    log(f"{'cum ms/fwd':>11} {'own ms/fwd':>11} {'calls':>7}  function")
    for ct, tt, nc, name in sorted(entries, reverse=True)[:60]:
        if any(k in name for k in keep):
            log(f"{1e3 * ct / rounds:11.3f} {1e3 * tt / rounds:11.3f} {nc:7d}  {name}")
    mask = sum(ct for ct, tt, nc, name in entries if "create_causal_mask" in name)
    fwd = sum(ct for ct, tt, nc, name in entries if name.startswith("specdec/target.py") and "(forward)" in name)
    lin = sum(tt for ct, tt, nc, name in entries if "_nn.linear" in name)
    if fwd:
        log(f"HF create_causal_mask, given our 4D mask: {1e3 * mask / rounds:.3f} ms per forward "
            f"({100 * mask / fwd:.1f}% of target forward); torch linear kernels: {100 * lin / fwd:.0f}% of it")
    res["profile"] = {"breakdown_best_repeat": {r["id"]: r["stage_ms_per_round_best_repeat"] for r in rows},
                      "mask_ms_per_forward": 1e3 * mask / rounds, "mask_pct_of_forward": 100 * mask / fwd if fwd else None}
    return res
