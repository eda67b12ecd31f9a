"""A/B, in one process: the heads' vocabulary projections in fp32 against the dtype `specdec.load` measures.

Two engines share the target model; one gets an fp32 copy of the heads. Every prompt runs every
method on both, in an order that alternates, and the figure is the median of per-request ratios
(chosen / fp32) after one warm-up pass, so machine noise hits both sides alike.

    python scripts/heads_precision_ab.py                      # embedded model, 8 prompts x 64 tokens, 3 passes
    python scripts/heads_precision_ab.py --prompts 2 --repeats 1 --tokens 16   # a quick check
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.request import GenerationRequest  # noqa: E402
from specdec.sampler import SamplingParams  # noqa: E402

GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)
METHODS = {"chain_greedy": (GREEDY, "chain", 0), "trained_greedy": (GREEDY, "trained", 0),
           "auto_greedy": (GREEDY, "auto", 0), "hybrid_greedy": (GREEDY, "auto", 10),
           "trained_sample": (SAMPLED, "trained", 0), "hybrid_sample": (SAMPLED, "auto", 10)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    loaded = specdec.load()
    chosen = loaded.engine
    fp32 = copy.deepcopy(chosen.heads)
    fp32.store_projections(torch.float32)
    engines = {"fp32": Engine(chosen.target, fp32, loaded.tokenizer, chosen.trained_tree), "chosen": chosen}
    print(f"measured choice: {chosen.heads.projection_dtype}; threads {torch.get_num_threads()}")
    for name, eng in engines.items():
        print(f"  {name}: the cost model's heads figure {1e3 * eng.cost_model().heads_s:.2f} ms")
    prompts = [loaded.tokenizer(p, add_special_tokens=False)["input_ids"] for p in DEFAULT_PROMPTS[: a.prompts]]
    got = {(m, n): [] for m in METHODS for n in engines}
    for rep in range(a.repeats + 1):  # the first pass warms up
        for i, ids in enumerate(prompts):
            for m, (params, tree, lookup) in METHODS.items():
                params = params if params.greedy else params.replace(seed=i + 100 * rep)
                for n in (list(engines) if (rep + i) % 2 == 0 else list(engines)[::-1]):
                    start = time.perf_counter()
                    request = GenerationRequest(ids, a.tokens, params, tree, True, "auto", None, lookup)
                    tokens = sum(len(ev.emitted) for ev in engines[n].stream(request))
                    if rep:
                        got[(m, n)].append(tokens / (time.perf_counter() - start))
    print("| method | tok/s, fp32 heads | tok/s, chosen | chosen / fp32 (median of pairs) |")
    print("| --- | ---: | ---: | ---: |")
    for m in METHODS:
        x, y = got[(m, "fp32")], got[(m, "chosen")]
        print(f"| {m} | {statistics.median(x):.0f} | {statistics.median(y):.0f} | "
              f"{statistics.median([b / a for a, b in zip(x, y)]):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
