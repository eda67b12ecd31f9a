"""Time to first token with and without the prefix KV cache, for prompts sharing a long prefix.

    python scripts/prefix_cache_ttft.py            # embedded model, CPU
    python scripts/prefix_cache_ttft.py --repeats 5 --json ttft.json

Every prompt is one long shared prefix (few-shot Python functions, about
400 tokens on the embedded tokenizer) plus a short, different suffix. TTFT
is the time until the engine yields round 0 (prefill + first token). The
cache is warmed with one request whose suffix is not measured, as a
server's cache would be after the first user; without the cache every
request prefills the whole prompt. A third row sends each prompt twice
(a regenerate). Also checks that the greedy outputs match.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from specdec.prefix_cache import PrefixCache  # noqa: E402
from specdec.sampler import SamplingParams  # noqa: E402

SHOTS = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


def read_lines(path):
    """Return the lines of a text file, without newlines."""
    with open(path) as f:
        return [line.rstrip("\\n") for line in f]


class Counter:
    """Count how often each item was seen."""

    def __init__(self):
        self.counts = {}

    def add(self, item):
        self.counts[item] = self.counts.get(item, 0) + 1

    def most_common(self, n=1):
        items = sorted(self.counts.items(), key=lambda kv: kv[1], reverse=True)
        return items[:n]


def flatten(nested):
    """Flatten a list of lists into one list."""
    out = []
    for items in nested:
        for item in items:
            out.append(item)
    return out


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="Process some files.")
    parser.add_argument("paths", nargs="+", help="input files")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--limit", type=int, default=10)
    return parser.parse_args(argv)


def chunks(items, size):
    """Yield successive chunks of `size` items."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


'''
SUFFIXES = ["def fibonacci(n):", "class Stack:", "def is_prime(n):", "def quicksort(items):",
            "def read_json(path):", "class Node:", "def binary_search(items, target):", "def main():",
            "def mean(values):", "class Queue:", "def reverse(text):"]


def ttft(loaded: specdec.Loaded, ids: list[int], max_new_tokens: int) -> tuple[float, list[int], int]:
    """Seconds to the first event, the greedy token ids, and the prefix-cache hit of one request."""
    t0 = time.perf_counter()
    stream = loaded.engine.stream(ids, max_new_tokens, SamplingParams(temperature=0.0))
    first = next(stream)
    t = time.perf_counter() - t0
    rest = list(stream)
    return t, [tok.token_id for ev in [first, *rest] for tok in ev.emitted], first.prefix_cache_hit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="passes over the suffixes")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    plain = specdec.load(device="cpu")
    cached = specdec.load(device="cpu", prefix_cache=PrefixCache())
    tok = plain.tokenizer
    prefix_len = len(tok(SHOTS, add_special_tokens=False)["input_ids"])
    prompts = [tok(SHOTS + s, add_special_tokens=False)["input_ids"] for s in SUFFIXES]
    ttft(plain, prompts[0], 1)  # warm both models' kernels
    rows = {"off": ([], []), "on, new suffix": ([], []), "on, same prompt again": ([], [])}  # (ms, prefilled)
    same = True
    for _ in range(args.repeats):
        cached.engine.prefix_cache.clear()
        ttft(cached, prompts[0], 1)  # the first user's request fills the cache; it is not measured
        for ids in prompts[1:]:  # interleaved, so drift on a shared machine hits every row alike
            t_off, out_off, _ = ttft(plain, ids, args.max_new_tokens)
            t_new, out_new, hit_new = ttft(cached, ids, args.max_new_tokens)  # shares the prefix only
            t_again, out_again, hit_again = ttft(cached, ids, args.max_new_tokens)  # a regenerate
            for key, t, hit in (("off", t_off, 0), ("on, new suffix", t_new, hit_new),
                                ("on, same prompt again", t_again, hit_again)):
                rows[key][0].append(t * 1e3)
                rows[key][1].append(len(ids) - hit)
            same &= out_off == out_new == out_again
    lens = [len(p) for p in prompts[1:]]
    rep = {"prefix_tokens": prefix_len, "prompt_tokens": [min(lens), max(lens)], "requests": len(rows["off"][0]),
           "threads": torch.get_num_threads(), "greedy_outputs_identical": same,
           "rows": {k: {"median_ms": statistics.median(ms), "prefilled": [min(n), max(n)], "ms": ms}
                    for k, (ms, n) in rows.items()}}
    print(f"shared prefix {prefix_len} tokens, prompts {min(lens)}-{max(lens)} tokens, "
          f"{rep['requests']} requests per row, {rep['threads']} torch threads\n")
    print("| prefix cache | median TTFT | prompt tokens prefilled | speedup |")
    print("| --- | --- | --- | --- |")
    base = rep["rows"]["off"]["median_ms"]
    for k, r in rep["rows"].items():
        lo, hi = r["prefilled"]
        print(f"| {k} | {r['median_ms']:.1f} ms | {lo if lo == hi else f'{lo}-{hi}'} | {base / r['median_ms']:.1f}x |")
    print(f"\ngreedy outputs identical with and without the cache: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
