"""How much a second OpenMP pool slows torch's CPU work on another thread (`specdec.threads`).

    python scripts/thread_pools.py            # three fresh interpreters, one line each

Each line times, as medians, a [64, 256] x [256, 256] product and the embedded model's 16-node tree
and one-node forwards: on the main thread; on a second thread after the main thread ran one parallel
op (two pools: the scheduler's case before `specdec.load` ran on a thread of its own); and on a
second thread while the main thread never did (one pool).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _median_ms(fn, reps: int = 40) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _measure(loaded) -> str:
    import torch

    target, tree = loaded.engine.target, loaded.engine.resolve_tree("trained")
    x, w = torch.randn(64, 256), torch.randn(256, 256)
    with torch.inference_mode():
        cache = target.new_cache(256)
        target.forward(torch.arange(20) % target.vocab_size, cache)
        length, tokens = cache.length, [5] * tree.num_nodes

        def tree_forward() -> None:
            target.forward(torch.tensor(tokens), cache, tree.ancestor_mask, tree.depth_t)
            cache.length = length

        def one_node() -> None:
            target.forward(torch.tensor(tokens[:1]), cache)
            cache.length = length

        return (f"product {_median_ms(lambda: x @ w, 200) * 1e3:.0f} µs, {tree.num_nodes}-node forward "
                f"{_median_ms(tree_forward):.2f} ms, one-node forward {_median_ms(one_node):.2f} ms")


def _child(mode: str) -> None:
    import torch

    import specdec

    loaded = specdec.load()  # on a thread of its own: the main thread has no pool yet
    if mode == "main":
        print(f"{'main thread:':40s}{_measure(loaded)}")
        return
    if mode == "two-pools":
        torch.randn(512, 512) @ torch.randn(512, 512)  # the main thread's first parallel op makes its pool
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(_measure(loaded)))
    thread.start()
    thread.join()
    label = "second thread, main thread's pool too" if mode == "two-pools" else "second thread, one pool"
    print(f"{label + ':':40s}{out[0]}")


def main() -> None:
    if len(sys.argv) > 1:
        return _child(sys.argv[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for mode in ("main", "two-pools", "one-pool"):
        subprocess.run([sys.executable, os.path.abspath(__file__), mode], cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    main()
