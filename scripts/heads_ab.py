"""A/B of heads folders in one process: default drafting, and the heads alone, against plain decoding.

The heads take turns per prompt (the order rotates), share one measured cost model, and store their
projections in fp16 alike, so a busy moment of the machine hits each of them. A figure is the median over
requests of plain decoding's time ÷ the method's time on the same prompt, seed and pass, after a warm-up pass.

    python scripts/heads_ab.py 8 64 3          # prompts, tokens, passes; about 10 minutes on 2 cores
    HEADS='{"shipped": "", "root": "runs/root_study/root"}' LAWS=t07 python scripts/heads_ab.py 4 64 1

HEADS maps a label to a heads folder ("" = the embedded heads); default: the shipped heads against
scripts/root_heads_study.py's two variants.
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec.request import GenerationRequest  # noqa: E402
from specdec.sampler import SamplingParams  # noqa: E402

NP, TOK, REP = (int(x) for x in sys.argv[1:4])
HEADS = json.loads(os.environ.get("HEADS", '{"shipped": "", "root": "runs/root_study/root", '
                                            '"plain": "runs/root_study/plain"}'))
LAWS = {"greedy": SamplingParams(), "t07": SamplingParams(temperature=0.7, top_p=0.9),
        "t1": SamplingParams(temperature=1.0)}
LAWS = {k: v for k, v in LAWS.items() if k in os.environ.get("LAWS", ",".join(LAWS)).split(",")}
MODES = {"default": dict(tree="auto", lookup=10), "heads alone": dict(tree="auto", lookup=0)}

loaded = {n: specdec.load(heads=p or None, heads_dtype="float16") for n, p in HEADS.items()}
names = list(loaded)
cost = loaded[names[0]].engine.cost_model()
for n in names:
    loaded[n].engine.set_cost_model(cost)
tok = loaded[names[0]].tokenizer
prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in DEFAULT_PROMPTS[:NP]]


def run(engine, ids, params, seed, **kw) -> tuple[float, float]:
    """Seconds, and tokens per round (tau)."""
    t0, rounds, emitted = time.perf_counter(), 0, 0
    for ev in engine.stream(GenerationRequest(ids, TOK, params.replace(seed=seed), eos_token_id=None, **kw)):
        if ev.index:
            rounds, emitted = rounds + 1, emitted + len(ev.emitted)
    return time.perf_counter() - t0, emitted / max(rounds, 1)


ratio, tau = {}, {}
for rep in range(REP + 1):  # pass 0 warms up
    for i, ids in enumerate(prompts):
        for law, params in LAWS.items():
            seed = 1000 * rep + i
            ref, _ = run(loaded[names[0]].engine, ids, params, seed, speculative=False)
            k = (rep + i) % len(names)
            for n in names[k:] + names[:k]:
                for mode, kw in MODES.items():
                    t, tpr = run(loaded[n].engine, ids, params, seed, **kw)
                    if rep:
                        ratio.setdefault((law, mode, n), []).append(ref / t)
                        tau.setdefault((law, mode, n), []).append(tpr)
for law in LAWS:
    for mode in MODES:
        print(f"{law:6s} {mode:11s} " + "  ".join(
            f"{n}: {statistics.median(ratio[law, mode, n]):.3f}x plain, tau {statistics.mean(tau[law, mode, n]):.2f}"
            for n in names))
