"""A/B in one process: the engine over the whole KV buffer (fixed shapes) or only the slots in use.

`python scripts/slot_width_ab.py`: 4 prompts x 96 tokens, 4 interleaved repeats, embedded model, 1 thread.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from specdec import kv_cache  # noqa: E402

torch.set_num_threads(1)
L = specdec.load(device="cpu")
prompts = ["def fibonacci(n):", "class Stack:", "import json\ndef load_config(path):", "def quicksort(arr):"]
real = kv_cache.new_cache
mode = {"fixed": False}
def nc(model, capacity=None):
    c = real(model, capacity)
    if capacity is not None: c.fixed_shapes = mode["fixed"]
    return c
kv_cache.new_cache = nc
res = {True: [], False: []}
for rep in range(4):
    for fixed in (False, True) if rep % 2 else (True, False):
        mode["fixed"] = fixed
        t = time.perf_counter(); n = 0
        for p in prompts:
            n += len(specdec.generate(L, p, max_new_tokens=96).token_ids)
        res[fixed].append(n / (time.perf_counter() - t))
for k, v in res.items(): print("fixed" if k else "trimmed", [round(x) for x in v], sorted(v)[len(v)//2])
