"""From timed runs to the reported figures: one row per method, and the run's metadata.

The figures' definitions are specdec.stats' (mean accepted length, per-depth acceptance,
percentiles); this module only says which runs and which clocks they are computed over.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from functools import reduce
from pathlib import Path

import torch

from specdec.stats import DepthCounts, percentile, throughput

from .config import BenchConfig
from .methods import Method
from .runners import STAGES, Run


def per_token_ms(run: Run) -> tuple[list[float], float | None]:
    """Per-token times (gap between emissions / tokens emitted) and time to first token, in ms."""
    if not run.marks:
        return [], None
    out = []
    for (t_prev, _), (t, n) in zip(run.marks, run.marks[1:]):
        out += [(t - t_prev) * 1e3 / n] * n if n else []
    return out, run.marks[0][0] * 1e3


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stage_ms(runs: list[Run]) -> dict[str, float] | None:
    """Milliseconds per decoding round in each stage of the engine's round, over these runs."""
    rounds = sum(r.rounds for r in runs)
    if not rounds:
        return None
    return {k: sum(r.stage_ms.get(k, 0.0) for r in runs) / rounds for k in STAGES + ("total",)}


def method_row(m: Method, reps: list[list[Run]], ref: list[list[int]], tok, mem_mb, tree_nodes: int | None,
               lookup: int, sampling: tuple[float, float] = (0.7, 0.9)) -> dict:
    """One method's runs (reps[repeat][prompt]) as the reported figures."""
    tok_s = [throughput(sum(len(r.token_ids) for r in rep), sum(r.seconds for r in rep)) for rep in reps]
    flat = [r for rep in reps for r in rep]
    per_tok, ttft = [], []
    for r in flat:
        p, t = per_token_ms(r)
        per_tok += p
        ttft += [t] if t is not None else []
    # tau from the emission marks, so that HF's runs get one too: tokens per forward after the first
    decode_tokens = sum(sum(n for _, n in r.marks[1:]) for r in flat)
    decode_rounds = sum(max(len(r.marks) - 1, 0) for r in flat)
    depths = reduce(DepthCounts.__add__, (r.depths for r in flat), DepthCounts())
    row = {
        "id": m.id, "label": m.label, "backend": m.backend, "sampling": m.sampling, "tree": m.tree,
        "temperature_top_p": m.sampling_params(*sampling) if m.sampling else None,
        "tree_nodes": None, "tok_s_median": statistics.median(tok_s), "tok_s_runs": tok_s,
        "new_tokens": sum(len(r.token_ids) for r in flat),
        "mean_accepted_length": decode_tokens / decode_rounds if decode_rounds else None,
        "acceptance_per_depth": depths.rates(),
        "acceptance_per_depth_conditional": depths.given_previous(),
        "depth_rounds": depths.reached, "depth_accepted": depths.accepted,
        "ms_per_token_p50": percentile(per_tok, 50), "ms_per_token_p99": percentile(per_tok, 99),
        "ttft_ms_median": statistics.median(ttft) if ttft else None,
        "peak_mem_mb": mem_mb,
    }
    if m.tree is not None:
        row["tree_nodes"] = tree_nodes
        row["lookup"], row["lookup_mode"] = (lookup if m.lookup else 0), m.lookup_mode
        rounds = sum(r.rounds for r in flat)
        row["mean_tree_nodes"] = sum(r.tree_nodes for r in flat) / rounds if rounds else None
        errors = [e for r in flat for e in r.expected_errors]
        row["expected_length_mae"] = sum(errors) / len(errors) if errors else None  # the dynamic tree only
    if m.backend == "engine":
        st = {k: sum(r.stage_ms.get(k, 0.0) for r in flat) for k in STAGES + ("total",)}
        row["stage_ms_per_round"] = _stage_ms(flat)
        # The least disturbed repeat (lowest ms per round): the --profile view on a noisy machine.
        per_rep = [s for s in map(_stage_ms, reps) if s is not None]
        row["stage_ms_per_round_best_repeat"] = min(per_rep, key=lambda d: d["total"]) if per_rep else None
        row["non_forward_pct"] = 100 * (st["total"] - st["forward"]) / st["total"] if st["total"] else None
        row["outside_round_ms_per_call"] = 1e3 * sum(r.seconds for r in flat) / len(flat) - (
            st["total"] + sum(r.marks[0][0] * 1e3 for r in flat)) / len(flat)
    if not m.sampling:
        n = len(ref)
        firsts = [first_diff(r.token_ids, ref[i % n]) for rep in reps for i, r in enumerate(rep)]
        row["greedy_check"] = {
            "runs": len(firsts), "tokens_equal": sum(f is None for f in firsts),
            "first_mismatch": min((f for f in firsts if f is not None), default=None),
            "text_equal": (sum(tok.decode(r.token_ids) == tok.decode(ref[i]) for rep in reps for i, r in enumerate(rep))
                           if tok is not None else None),
        }
        row["greedy_equal"] = row["greedy_check"]["tokens_equal"] == len(firsts)
    return row


def machine_meta(cfg: BenchConfig, loaded, oracle, memory, n_prompts: int, elapsed: float) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    info = loaded.engine.info()
    dev = loaded.device
    return {
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv and sys.argv[0] else "",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "elapsed_s": elapsed,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "platform": platform.platform()},
        "model": loaded.name, "params_m": info["params"] / 1e6, "device": info["device"], "dtype": info["dtype"],
        "heads": cfg.heads or ("shipped" if loaded.heads is not None else None),
        "oracle_accuracy": oracle.accuracy if oracle is not None else None,
        # every tree then accepts like a chain: tau = sum of accuracy**d, d = 0..K (before the length cap)
        "oracle_expected_tau": (sum(oracle.accuracy ** d for d in range(oracle.config.num_heads + 1))
                                if oracle is not None else None),
        "trained_tree_nodes": info["trees"].get("trained"),
        "cuda_graphs": info.get("cuda_graphs"),  # None: eager; else what was captured and what fell back
        "prompts": n_prompts, "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "warmup": cfg.warmup,
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0},
        "prompt_lookup_num_tokens": cfg.lookup, "stop_at_eos": cfg.stop_at_eos,
        "load_average_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "memory_method": next(iter(memory.values()))[1] if memory else None,
    }
