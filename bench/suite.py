"""The benchmark loop: every method on every prompt, interleaved, then one row per method."""
from __future__ import annotations

import gc
import json
import os
import time

import torch

import specdec
from specdec.api import DEFAULT_MODEL
from specdec.threads import off_the_callers_thread

from .config import BenchConfig
from .memory import peak_memory_mb
from .methods import BY_ID, TARGETS, VERSUS_STATIC, Method, select_methods
from .models import load_target
from .oracle import OracleHeads
from .rows import machine_meta, method_row
from .runners import Run, engine_request, on_rounds_thread, run_method


def benchmark(cfg: BenchConfig, loaded: specdec.Loaded | None = None, oracle: OracleHeads | None = None,
              log=print, checkpoint=None) -> dict:
    """Run every method on every prompt; return the results as plain values (the JSON report).

    `checkpoint(result)`, if given, receives a partial result after every repeat (medians over the
    repeats so far, no memory figures, meta["partial"] set), so a run cut short by a time limit
    still leaves numbers behind.
    """
    started = time.perf_counter()
    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if loaded is None:
        loaded, oracle = load_target(cfg)
    # What is alive now (models, libraries) is never garbage: out of the collector's sight, the collect
    # before each timed call costs what the runs left behind, not a walk over every object (0.25 s a call
    # inside a test process).
    gc.freeze()
    tok = loaded.tokenizer
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))  # to encode prompts for models without one
    V = loaded.model.config.vocab_size
    prompts = [[i for i in tok(p, add_special_tokens=False)["input_ids"] if i < V] for p in cfg.prompts]
    methods = select_methods(cfg.methods, loaded.heads is not None, bool(loaded.tree_paths), oracle is not None,
                             loaded.eagle is not None)
    for m in methods:  # every request is checked before the first timed run, not in the middle of one
        if m.backend == "engine":
            engine_request(m, cfg, prompts[0], cfg.seed, cfg.max_new_tokens).plan(loaded.engine)
    N = cfg.max_new_tokens

    # The oracle needs the greedy continuation (plus room for the deepest head) before any engine run: the
    # engine's own, which in fp32 is HF's token for token. In bf16 HF's cached and cache-free forwards already
    # disagree on the argmax at near-ties (8% of positions on a random Qwen2-0.5B shape), so an HF reference
    # would make the oracle propose tokens the engine's own forwards do not pick.
    conts: list[list[int] | None] = [None] * len(prompts)
    if oracle is not None:
        K = oracle.config.num_heads
        conts = [run_method(loaded, ids, BY_ID["plain_greedy"], cfg, 0, N + K + 1).token_ids for ids in prompts]
    if any(m.tree == "auto" for m in methods):
        # The dynamic tree sizes itself by the round costs of this machine, measured now, not read
        # from a cache another load (perhaps on a busier machine) wrote. Oracle heads need a reference.
        if oracle is not None:
            on_rounds_thread(loaded, oracle.begin, list(prompts[0]) + list(conts[0]))
        # off this thread on a CPU: a torch op here would start a second OpenMP pool (see `runners.run_hf`)
        loaded.engine.set_cost_model(off_the_callers_thread(loaded.device, specdec.cost.measure, loaded.engine))

    log(f"bench: {len(methods)} methods x {len(prompts)} prompts x {cfg.repeats} repeats, "
        f"{N} new tokens, {loaded.name} on {cfg.device}/{loaded.model.dtype}, threads={torch.get_num_threads()}")
    if loaded.device.type == "cuda":  # a silent eager fallback would make every figure below an eager one
        log(f"  cuda graphs: {json.dumps(loaded.engine.info()['cuda_graphs'])}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if loaded.device.type == "cpu" and load > 0.5:
        log(f"  note: load average {load:.1f} before the run: other work shares this CPU, so timings are noisy"
            + (" (with several torch threads, a busy CPU slows every op a lot: try --threads 1)"
               if torch.get_num_threads() > 1 and load > 1.0 else ""))
    for _ in range(cfg.warmup):
        for m in methods:
            run_method(loaded, prompts[0], m, cfg, cfg.seed, N, oracle, conts[0], 0)
    runs: dict[str, list[list[Run]]] = {m.id: [[] for _ in range(cfg.repeats)] for m in methods}
    for rep in range(cfg.repeats):
        t_rep = time.perf_counter()
        for pi, ids in enumerate(prompts):
            shift = (rep * len(prompts) + pi) % len(methods)
            for m in methods[shift:] + methods[:shift]:
                seed = cfg.seed + 1000 * rep + pi
                runs[m.id][rep].append(run_method(loaded, ids, m, cfg, seed, N, oracle, conts[pi], pi))
        log(f"  repeat {rep + 1}/{cfg.repeats}: {time.perf_counter() - t_rep:.1f}s")
        if checkpoint is not None:  # the last one too: the memory runs below take a run per method
            done = {k: v[: rep + 1] for k, v in runs.items()}
            partial = assemble(cfg, loaded, oracle, methods, done, {m.id: (None, "") for m in methods}, tok,
                               len(prompts), started)
            partial["meta"]["partial"] = f"{rep + 1} of {cfg.repeats} repeats"
            checkpoint(partial)
    memory = {}  # last: the CPU measurement changes malloc settings (see peak_memory_mb)
    for m in methods:
        memory[m.id] = peak_memory_mb(lambda: run_method(loaded, prompts[0], m, cfg, cfg.seed, N, oracle, conts[0], 0),
                                      loaded.device)

    return assemble(cfg, loaded, oracle, methods, runs, memory, tok, len(prompts), started)


def _ratio(a, b):
    return a / b if a is not None and b else None


def assemble(cfg: BenchConfig, loaded, oracle, methods: list[Method], runs, memory, tok, n_prompts: int,
             started: float) -> dict:
    """Per-method rows, speedups and the targets (`methods.TARGETS`) from the timed runs."""
    ref = [r.token_ids for r in runs["hf_greedy"][0]]
    trees = loaded.engine.info()["trees"]
    rows = [method_row(m, runs[m.id], ref, tok if loaded.tokenizer is not None else None, memory[m.id][0],
                       _tree_nodes(loaded, trees, m.tree), cfg.lookup, (cfg.temperature, cfg.top_p)) for m in methods]
    base = {r["id"]: r for r in rows}
    plain = {(r["sampling"], r["temperature_top_p"]): r for r in rows if r["backend"] == "engine" and r["tree"] is None}
    for r in rows:
        r["speedup_vs_hf_greedy"] = _ratio(r["tok_s_median"], base["hf_greedy"]["tok_s_median"])
        # against own plain decoding of the same law (greedy, or the same temperature and top-p)
        r["speedup_vs_plain"] = _ratio(r["tok_s_median"], plain.get((r["sampling"], r["temperature_top_p"]),
                                                                    {}).get("tok_s_median"))
        tau = r["mean_accepted_length"]
        r["efficiency"] = _ratio(r["speedup_vs_hf_greedy"], tau) if r["backend"] == "engine" and r["tree"] else None
    targets = [{"name": name, "ratio": _ratio(base[a]["tok_s_median"], base[b]["tok_s_median"]), "target": t,
                "met": (base[a]["tok_s_median"] / base[b]["tok_s_median"] >= t)}
               for name, a, b, t in TARGETS if a in base and b in base]
    for name, a, statics in VERSUS_STATIC:
        present = [base[s] for s in statics if s in base]
        if a in base and present:
            best = max(present, key=lambda r: r["tok_s_median"])
            ratio = _ratio(base[a]["tok_s_median"], best["tok_s_median"])
            targets.append({"name": f"{name} ({best['id']})", "ratio": ratio, "target": 1.0, "met": ratio >= 1.0})
    meta = machine_meta(cfg, loaded, oracle, memory, n_prompts, time.perf_counter() - started)
    if any(m.tree == "auto" for m in methods):
        cost = loaded.engine.cost_model()
        meta["cost_model_ms"] = {"forward": dict(zip(cost.nodes, (1e3 * t for t in cost.forward_s))),
                                 "heads": 1e3 * cost.heads_s, "overhead": 1e3 * cost.overhead_s}
    return {"meta": meta, "methods": rows, "targets": targets}


def _tree_nodes(loaded, trees: dict[str, int], tree: str | None) -> int | None:
    """Nodes of a method's static tree, root included (None: plain decoding, or a policy without a fixed size)."""
    if tree is None:
        return None
    if tree == "none":
        return 1
    return trees.get(tree)
