"""A/B of the dynamic tree's constants (and cost learning), in one process, the variants taking turns.

Each variant is a set of `specdec.tree_policy` constants to override, plus `"learn": true|false` (the
cost model refreshed after each request, `Engine.set_cost_model(..., learn=...)`; default true).
Each variant has its own `PolicyMemory` and its own cost model; static trees and plain decoding are
the references, run once per prompt and pass. A figure is the median over requests of
(method's tok/s ÷ its reference's tok/s on the same prompt and pass), after one warm-up pass.

    VARIANTS='{"old": {"learn": false, "TRIAL": 1, "RATE_WEIGHT": 0.3}, "new": {"learn": false}}' \
        python scripts/policy_constants_ab.py 8 64 3          # prompts, tokens, passes: about 8 minutes
    METHODS=chain_greedy,auto_greedy VARIANTS=... python scripts/policy_constants_ab.py 4 32 1   # a quick check
"""
import json, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specdec
from specdec import tree_policy
from bench.config import DEFAULT_PROMPTS
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec.tree_policy import PolicyMemory
NP, TOK, REP = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
VARIANTS = json.loads(os.environ["VARIANTS"])
LEARN = {n: v.pop("learn", True) for n, v in VARIANTS.items()}
loaded = specdec.load(); engine, tok = loaded.engine, loaded.tokenizer
prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in DEFAULT_PROMPTS[:NP]]
G, T07, T1 = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0)
METHODS = {"chain_greedy": (G, "chain", 0, True, False), "trained_greedy": (G, "trained", 0, True, False),
           "auto_greedy": (G, "auto", 0, True, True), "hybrid_greedy": (G, "auto", 10, True, True),
           "plain_t07": (T07, "auto", 0, False, False), "auto_t07": (T07, "auto", 0, True, True), "hybrid_t07": (T07, "auto", 10, True, True),
           "plain_t1": (T1, "auto", 0, False, False), "auto_t1": (T1, "auto", 0, True, True), "hybrid_t1": (T1, "auto", 10, True, True)}
METHODS = {k: v for k, v in METHODS.items() if k in os.environ.get("METHODS", ",".join(METHODS)).split(",")}
FIG = [("auto_greedy", "chain_greedy"), ("auto_greedy", "trained_greedy"), ("hybrid_greedy", "chain_greedy"),
       ("auto_t07", "plain_t07"), ("hybrid_t07", "plain_t07"), ("auto_t1", "plain_t1"), ("hybrid_t1", "plain_t1")]
defaults = {k: getattr(tree_policy, k) for v in VARIANTS.values() for k in v}
mems = {n: PolicyMemory() for n in VARIANTS}; names = list(VARIANTS)
m0 = engine.cost_model(); costs = {n: m0 for n in VARIANTS}
got, rounds = {}, {}
for rep in range(REP + 1):
    for i, ids in enumerate(prompts):
        k = (rep + i) % len(names)
        for name in names[k:] + names[:k]:
            for c, v in defaults.items(): setattr(tree_policy, c, v)
            for c, v in VARIANTS[name].items(): setattr(tree_policy, c, v)
            engine.policy_memory = mems[name]
            engine.set_cost_model(costs[name], learn=LEARN[name])
            for m, (law, tree, lookup, spec, varies) in METHODS.items():
                if not varies and name != names[0]: continue
                params = law if law.greedy else law.replace(seed=i + 100 * rep)
                req = GenerationRequest(ids, TOK, params, tree=tree, lookup=lookup, speculative=spec, eos_token_id=None)
                t = time.perf_counter(); n = 0; r = 0
                for ev in engine.stream(req): n += len(ev.emitted); r += 1
                costs[name] = engine.cost_model()
                if rep:
                    key = (m, name if varies else names[0])
                    got.setdefault(key, []).append(n / (time.perf_counter() - t)); rounds.setdefault(key, []).append(r - 1)
print("| figure | " + " | ".join(names) + " |")
for m, ref in FIG:
    if (m, names[0]) not in got or (ref, names[0]) not in got: continue
    row = [statistics.median([y / x for x, y in zip(got[(ref, names[0])], got[(m, n)])]) for n in names]
    print(f"| {m} ÷ {ref} | " + " | ".join(f"{r:.3f}" for r in row) + " |")
for m in METHODS:
    print(m, "rounds/request", " ".join(f"{statistics.mean(rounds[(m, n)]):.1f}" for n in names if (m, n) in rounds))

for n in names:
    c = costs[n]
    print(n, "round_time ms", [round(1e3 * c.round_time(k, 0), 2) for k in (1, 2, 4, 6, 8, 12, 16, 32, 64)], "heads", round(1e3 * c.heads_s, 3))
