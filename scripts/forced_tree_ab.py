"""One-process A/B: the dynamic tree's own path drafting a tree you force, against static trees and plain decoding.

Separates what the dynamic policy's work costs from what its trees are worth. A forced variant runs the
whole "auto" path (head scores, `choose`, learning from the verdict) but drafts the given rank paths every
round, with every head it needs; so `force:trained` against `static:trained` drafts the same trees and
differs only by the policy's own work. Requests take turns per prompt, in a rotating order; figures are
speeds relative to the first variant (median of per-request ratios, and totals), tau and time per round.

    python scripts/forced_tree_ab.py static:trained force:trained auto          # greedy, 8 prompts x 64
    T=0.7 TOP_P=0.9 python scripts/forced_tree_ab.py plain auto "force:[[0]]" "force:[[0],[0,0]]" "force:[[0],[1]]"
    PASSES=4 PROMPTS=8 TOKENS=64 ...                                            # the defaults
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec import tree_policy  # noqa: E402
from specdec.request import GenerationRequest  # noqa: E402
from specdec.sampler import SamplingParams  # noqa: E402

FORCED: list[tuple | None] = [None]  # the rank paths the running variant forces (None: the policy's own)


def _install() -> None:
    """Let a forced variant keep the policy's work but replace its answers."""
    choose, wants = tree_policy.DynamicTree.choose, tree_policy.DynamicTree.wants_heads

    def forced_wants(self, chain, room, greedy, *match):
        k = wants(self, chain, room, greedy, *match)
        return k if FORCED[0] is None else max(map(len, FORCED[0]))

    def forced_choose(self, q, chain, room, greedy, *match):
        c = choose(self, q, chain, room, greedy, *match)
        if FORCED[0] is None or q is None:
            return c
        return tree_policy.Choice(tuple(p for p in FORCED[0] if len(p) <= min(room, len(q))), 0, c.expected)

    tree_policy.DynamicTree.wants_heads, tree_policy.DynamicTree.choose = forced_wants, forced_choose


def main() -> None:
    names = sys.argv[1:] or ["static:trained", "force:trained", "auto"]
    T, top_p = float(os.environ.get("T", "0")), float(os.environ.get("TOP_P", "1"))
    passes, n_prompts, tokens = (int(os.environ.get(k, d)) for k, d in (("PASSES", 4), ("PROMPTS", 8), ("TOKENS", 64)))
    loaded = specdec.load()
    engine, tok = loaded.engine, loaded.tokenizer
    trained = engine.trained_tree or ()
    variants = []
    for name in names:
        kind, _, arg = name.partition(":")
        if kind == "plain":
            variants.append((name, dict(speculative=False), None))
        elif kind == "auto":
            variants.append((name, dict(tree="auto", lookup=0), None))
        elif kind == "static":
            variants.append((name, dict(tree=arg, lookup=0), None))
        elif kind == "force":
            paths = trained if arg == "trained" else tuple(tuple(p) for p in json.loads(arg))
            variants.append((name, dict(tree="auto", lookup=0), tuple(sorted(paths, key=lambda p: (len(p), p)))))
        else:
            raise SystemExit(f"unknown variant {name!r}: plain, auto, static:<tree>, force:trained or force:<json paths>")
    _install()
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in DEFAULT_PROMPTS[:n_prompts]]
    times = {v[0]: [] for v in variants}
    stats = {v[0]: Counter() for v in variants}

    def run(variant, ids, seed, record=True):
        name, kw, forced = variant
        FORCED[0] = forced
        params = SamplingParams(temperature=T, top_p=top_p, seed=seed) if T > 0 else SamplingParams()
        start, events = time.perf_counter(), list(engine.stream(GenerationRequest(ids, tokens, params,
                                                                                 eos_token_id=None, **kw)))
        if record:
            times[name].append(time.perf_counter() - start)
            for ev in events[1:]:
                stats[name].update(rounds=1, tokens=len(ev.emitted), nodes=max(len(ev.nodes), 1))

    for v in variants:  # warm-up, and the cost model is measured once, before any timing
        for ids in prompts[:2]:
            run(v, ids, 0, record=False)
    gc.disable()
    for p in range(passes):
        for i, ids in enumerate(prompts):
            k = (i + p) % len(variants)
            for v in variants[k:] + variants[:k]:
                run(v, ids, 1000 * p + i)
    ref = variants[0][0]
    print(f"T={T} top_p={top_p}, {n_prompts} prompts x {tokens} tokens x {passes} passes; speed against {ref}")
    print("| variant | speed (median) | speed (total) | tau | nodes/round | ms/round |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, _, _ in variants:
        s = stats[name]
        ratios = [a / b for a, b in zip(times[ref], times[name])]
        print(f"| {name} | {statistics.median(ratios):.3f} | {sum(times[ref]) / sum(times[name]):.3f} | "
              f"{s['tokens'] / s['rounds']:.2f} | {s['nodes'] / s['rounds']:.1f} | {1e3 * sum(times[name]) / s['rounds']:.2f} |")


if __name__ == "__main__":
    main()
