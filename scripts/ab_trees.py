"""Old tree against new tree on the user path (`specdec.generate` at its defaults), interleaved in one run.

Each source tree (a `git worktree` of a base commit, and this checkout) gets one worker process that loads
the embedded model once; the driver then alternates them, pair after pair (which goes first alternates
too), over the held-out bench prompts, greedy and at T=0.7/top-p 0.9. Only one worker runs at a time.

Each load measures its own cost model, and the trees it sizes vary from one process to the next by a few
percent of a run's rounds, so one process per tree would fix a draw of that for the whole run: `--procs`
starts that many fresh pairs of workers, one after another, and splits the pairs among them.

    git worktree add /tmp/base <commit>
    python scripts/ab_trees.py --old /tmp/base --new . --pairs 7 --json runs/ab_trees.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, sys, time
import specdec
from bench.config import DEFAULT_PROMPTS
loaded = specdec.load(**json.loads(os.environ.get("SPECDEC_AB_LOAD", "{}")))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    kw = dict(temperature=0.7, top_p=0.9, seed=job["seed"]) if job["sampled"] else {}
    n, t0 = 0, time.perf_counter()
    for p in DEFAULT_PROMPTS[: job["prompts"]]:
        n += len(specdec.generate(loaded, p, max_new_tokens=job["tokens"], eos_token_id=None, **kw).token_ids)
    print(json.dumps({"tok_s": n / (time.perf_counter() - t0)}), flush=True)
"""


class Worker:
    def __init__(self, tree: Path, load: str = "{}") -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "SPECDEC_AB_LOAD": load}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, **job) -> float:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["tok_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the base commit's source tree")
    ap.add_argument("--new", default=".", help="this checkout")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--procs", type=int, default=1, help="fresh worker pairs, one after another (each loads anew)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--new-load", default="{}", help='keyword arguments of the new tree\'s specdec.load, as JSON '
                                                      '(e.g. \'{"heads_dtype": "bfloat16"}\')')
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:  # refused here, not in the worker
        if not isinstance(json.loads(args.new_load), dict):
            raise ValueError
    except ValueError:
        ap.error(f"--new-load must be a JSON object of keyword arguments, got {args.new_load!r}")
    if not 1 <= args.procs <= args.pairs:
        ap.error(f"--procs must be between 1 and --pairs ({args.pairs}), got {args.procs}")
    modes = args.modes.split(",")
    if not set(modes) <= {"greedy", "sampled"}:
        ap.error(f"--modes must be greedy, sampled or both (comma-separated), got {args.modes!r}")
    rates = {mode: {"old": [], "new": []} for mode in modes}
    for p in range(args.procs):
        workers = {"old": Worker(Path(args.old).resolve()), "new": Worker(Path(args.new).resolve(), args.new_load)}
        try:
            for mode in modes:
                for w in workers.values():  # warm-up
                    w.run(sampled=mode == "sampled", seed=0, prompts=2, tokens=32)
                for j, i in enumerate(range(p, args.pairs, args.procs)):
                    for name in (("old", "new") if (j + p) % 2 == 0 else ("new", "old")):  # alternates in a process
                        rates[mode][name].append(workers[name].run(sampled=mode == "sampled", seed=i,
                                                                   prompts=args.prompts, tokens=args.tokens))
        finally:
            for w in workers.values():
                w.close()
    out = {}
    for mode in modes:
        ratios = [n / o for n, o in zip(rates[mode]["new"], rates[mode]["old"])]
        per_proc, k = [], 0
        for p in range(args.procs):  # each process ran pairs p, p + procs, ... in turn
            n = len(range(p, args.pairs, args.procs))
            per_proc.append(statistics.median(ratios[k : k + n]))
            k += n
        row = {"old_tok_s": statistics.median(rates[mode]["old"]), "new_tok_s": statistics.median(rates[mode]["new"]),
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "per_process_medians": per_proc}
        out[mode] = row
        print(f"{mode:7s} old {row['old_tok_s']:6.1f} new {row['new_tok_s']:6.1f} tok/s  new/old median "
              f"{row['ratio_median']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]; per process "
              + " ".join(f"{r:.3f}" for r in per_proc), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"pairs": args.pairs, "procs": args.procs, "prompts": args.prompts,
                                               "tokens": args.tokens,
                                               "rows": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
