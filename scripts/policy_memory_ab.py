"""A/B, in one process: the dynamic tree with the engine's `PolicyMemory` against the same policy without it.

One engine, one target and one set of heads; the two variants take turns (the order rotates from
prompt to prompt), each with its own memory that only its own requests teach. Every method runs every
prompt in every pass, and a figure is the median over requests of (method's tok/s ÷ its reference's
tok/s on the same prompt and pass), after one warm-up pass that also fills the memories. Static
`chain` and plain decoding are the references, run once per prompt and pass.

    python scripts/policy_memory_ab.py                         # 12 prompts x 64 tokens x 5 passes, ~10 min
    python scripts/policy_memory_ab.py --prompts 4 --repeats 1 --tokens 16   # a quick check
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec.request import GenerationRequest  # noqa: E402
from specdec.sampler import SamplingParams  # noqa: E402
from specdec.tree_policy import PolicyMemory  # noqa: E402


class NoMemory:
    """The policy as it was: every request starts cold."""

    def warm(self, policy) -> None:
        pass

    def learn(self, policy) -> None:
        pass


GREEDY, T07, T1 = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0)
# name: (law, tree, lookup, speculative, runs under each variant)
METHODS = {"chain_greedy": (GREEDY, "chain", 0, True, False), "auto_greedy": (GREEDY, "auto", 0, True, True),
           "hybrid_greedy": (GREEDY, "auto", 10, True, True), "plain_t1": (T1, "auto", 0, False, False),
           "auto_t1": (T1, "auto", 0, True, True), "hybrid_t1": (T1, "auto", 10, True, True),
           "plain_t07": (T07, "auto", 0, False, False), "hybrid_t07": (T07, "auto", 10, True, True)}
FIGURES = (("auto_greedy", "chain_greedy"), ("hybrid_greedy", "chain_greedy"), ("auto_t1", "plain_t1"),
           ("hybrid_t1", "plain_t1"), ("hybrid_t07", "plain_t07"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    loaded = specdec.load()
    engine, tok = loaded.engine, loaded.tokenizer
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in DEFAULT_PROMPTS[: a.prompts]]
    variants = {"no memory": NoMemory(), "memory": PolicyMemory()}
    names = list(variants)
    got: dict[tuple[str, str], list[float]] = {}
    for rep in range(a.repeats + 1):  # the first pass warms up
        for i, ids in enumerate(prompts):
            k = (rep + i) % len(names)
            for name in names[k:] + names[:k]:
                engine.policy_memory = variants[name]
                for m, (law, tree, lookup, speculative, varies) in METHODS.items():
                    if not varies and name != names[0]:
                        continue
                    params = law if law.greedy else law.replace(seed=i + 100 * rep)
                    request = GenerationRequest(ids, a.tokens, params, tree=tree, lookup=lookup,
                                                speculative=speculative, eos_token_id=None)
                    start = time.perf_counter()
                    tokens = sum(len(ev.emitted) for ev in engine.stream(request))
                    if rep:
                        got.setdefault((m, name if varies else names[0]), []).append(
                            tokens / (time.perf_counter() - start))
    print("| figure (median of per-request ratios) | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for m, ref in FIGURES:
        row = [statistics.median([y / x for x, y in zip(got[(ref, names[0])], got[(m, n)])]) for n in names]
        print(f"| {m} ÷ {ref} | " + " | ".join(f"{r:.3f}" for r in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
