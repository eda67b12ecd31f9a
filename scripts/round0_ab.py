"""Round 0 shared by the requests that join together, against one forward per joining request.

    python scripts/round0_ab.py --max-new-tokens 64 --passes 7

The load test's requests (loadtest.py's workload: 8 clients x 3 requests) are submitted at once to a
scheduler of 8 rows on the embedded model; the two ways alternate in one process, after a warm-up
pass each, and every output must be the same both ways. Prints the median tokens/s of each and
their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import loadtest  # noqa: E402
import specdec  # noqa: E402
from specdec.api import encode  # noqa: E402
from specdec.batch import Batch  # noqa: E402
from specdec.lookup import DEFAULT_LOOKUP  # noqa: E402
from specdec.scheduler import Scheduler  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=7)
    p.add_argument("--max-batch-size", type=int, default=8)
    a = p.parse_args()
    args = loadtest.parse_args(["--engine", "--max-new-tokens", str(a.max_new_tokens)])
    loaded = specdec.load()
    requests = [specdec.GenerationRequest(encode(loaded, prompt), a.max_new_tokens,
                                          specdec.SamplingParams(temperature=args.temperature, seed=seed),
                                          "auto", True, "lossless", lookup=DEFAULT_LOOKUP)
                for prompt, seed in loadtest.workload(args)]
    shared = Batch.first_rounds
    ways = {"shared": shared, "one each": lambda self, ms: [(m, self._first_round(m)) for m in ms]}
    rates: dict[str, list[float]] = {k: [] for k in ways}
    outputs: dict[str, list] = {}
    try:
        for rep in range(a.passes + 1):  # pass 0 warms up
            for name in (list(ways) if rep % 2 else list(ways)[::-1]):
                Batch.first_rounds = ways[name]
                with Scheduler(loaded.engine, max_batch_size=a.max_batch_size) as s:
                    s.call(loaded.engine.cost_model)
                    t0 = time.perf_counter()
                    events = [t.result() for t in [s.submit(r) for r in requests]]
                    dt = time.perf_counter() - t0
                outputs[name] = [[t.token_id for ev in evs for t in ev.emitted] for evs in events]
                if rep:
                    rates[name].append(sum(map(len, outputs[name])) / dt)
    finally:
        Batch.first_rounds = shared
    med = {k: statistics.median(v) for k, v in rates.items()}
    print({k: round(v) for k, v in med.items()}, f"ratio {med['shared'] / med['one each']:.3f}",
          "identical" if outputs["shared"] == outputs["one each"] else "OUTPUTS DIFFER")


if __name__ == "__main__":
    main()
