"""A/B each optional mechanism on the path users take (`specdec.generate`, the scheduler), in one process.

The mechanisms these A/Bs removed (a cross-request calibration memory, the heads' dtype chosen at load,
root-token heads, a cost model learnt from the engine's own rounds) are in git's history with their figures
in BENCHMARKS.md; those left are timed here.

For each mechanism the two variants run interleaved (on, off, on, off, ...) over the held-out bench prompts,
greedy and at T=0.7/top-p 0.9 (`--modes plain`: greedy without drafting), `--pairs` times after a warm-up;
each pair gives a ratio of tokens per second (on / off). An A/A row (the default against itself) shows the
run-to-run spread the others must beat.

    python scripts/ab_mechanisms.py --pairs 5 --json runs/ab_mechanisms.json
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
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec import tree_policy  # noqa: E402
from specdec.batch import Batch  # noqa: E402
from specdec.target import TargetModel  # noqa: E402


def _state(loaded):
    return loaded.engine.target.packed_rows is not None


def _restore(loaded, state):
    loaded.engine.target.use_packed_rows(state)
    tree_policy.DynamicTree._rest, tree_policy.DynamicTree.__init__ = _REST, _INIT
    Batch._verify_greedy = _JOINT
    TargetModel._lone_inputs = _LONE


_REST, _INIT = tree_policy.DynamicTree._rest, tree_policy.DynamicTree.__init__
_JOINT = Batch._verify_greedy
_LONE = TargetModel._lone_inputs


def _never_rest(loaded):
    def no_probe_init(self, *a, **k):
        _INIT(self, *a, **k)
        self.probe = False

    tree_policy.DynamicTree._rest = lambda self: None
    tree_policy.DynamicTree.__init__ = no_probe_init


# name -> (the mechanism on, the mechanism off): each changes the loaded defaults, which are put back after
MECHANISMS = {
    "A/A (default against itself)": (lambda loaded: None, lambda loaded: None),
    "packed rows": (lambda loaded: loaded.engine.target.use_packed_rows(True),
                    lambda loaded: loaded.engine.target.use_packed_rows(False)),
    "heads' rest/probe schedule": (lambda loaded: None, _never_rest),
    # each greedy member then verifies alone (in `Batch.finish`); only a batch (--batch > 1) has a joint pass
    "a batch's joint greedy verify": (lambda loaded: None,
                                      lambda loaded: setattr(Batch, "_verify_greedy", lambda self, *a: ({}, 0.0))),
    # off: a lone request's round builds the batch's padded 4D mask, as two or more requests' do
    "a lone request's own masks": (lambda loaded: None,
                                   lambda loaded: setattr(TargetModel, "_lone_inputs", TargetModel._batch_inputs)),
}


def run(loaded, prompts, new_tokens, mode: str, seed: int, batch: int = 1) -> tuple[int, float]:
    kw = {"sampled": dict(temperature=0.7, top_p=0.9, seed=seed), "plain": dict(speculative=False)}.get(mode, {})
    tokens, t0 = 0, time.perf_counter()
    if batch > 1:  # the scheduler's batches: `generate_batch` over `batch` prompts at a time
        for i in range(0, len(prompts), batch):
            out = specdec.generate_batch(loaded, prompts[i : i + batch], max_new_tokens=new_tokens,
                                         eos_token_id=None, **kw)
            tokens += sum(len(r.token_ids) for r in out)
        return tokens, time.perf_counter() - t0
    for p in prompts:
        tokens += len(specdec.generate(loaded, p, max_new_tokens=new_tokens, eos_token_id=None, **kw).token_ids)
    return tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--only", default="", help="comma-separated mechanism names (default: all)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--batch", type=int, default=1, help="requests decoded together (1: one `generate` at a time)")
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch must be an integer >= 1, got {args.batch}")
    if not set(args.modes.split(",")) <= {"greedy", "sampled", "plain"}:
        ap.error(f"--modes must be comma-separated greedy, sampled, plain (greedy without drafting), "
                 f"got {args.modes!r}")
    unknown = set(args.only.split(",")) - set(MECHANISMS) if args.only else set()
    if unknown:
        ap.error(f"--only names unknown mechanisms {sorted(unknown)}; known: {list(MECHANISMS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = specdec.load(heads="medusa")
    info = loaded.engine.info()
    print(f"torch threads {torch.get_num_threads()}, heads dtype {info['heads_dtype']}, "
          f"packed rows {loaded.engine.target.packed_rows is not None}", flush=True)
    prompts = DEFAULT_PROMPTS
    names = [n for n in MECHANISMS if not args.only or n in args.only.split(",")]
    out = {}
    for mode in args.modes.split(","):
        run(loaded, prompts[:2], 32, mode, 0, args.batch)  # warm-up
        for name in names:
            setups = dict(zip((True, False), MECHANISMS[name]))
            ratios, on_rates, off_rates = [], [], []
            for i in range(args.pairs):
                order = (True, False) if i % 2 == 0 else (False, True)  # alternate which goes first
                rates = {}
                for on in order:
                    state = _state(loaded)
                    setups[on](loaded)
                    try:
                        n, s = run(loaded, prompts, args.new_tokens, mode, i, args.batch)
                    finally:
                        _restore(loaded, state)
                    rates[on] = n / s
                on_rates.append(rates[True])
                off_rates.append(rates[False])
                ratios.append(rates[True] / rates[False])
            row = {"on_tok_s": statistics.median(on_rates), "off_tok_s": statistics.median(off_rates),
                   "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
            out[f"{name} · {mode}"] = row
            print(f"{mode:7s} {name:32s} on {row['on_tok_s']:6.1f} off {row['off_tok_s']:6.1f} tok/s  "
                  f"on/off median {row['ratio_median']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pairs": args.pairs, "new_tokens": args.new_tokens, "prompts": len(prompts), "batch": args.batch,
                       "rows": out},
                      f, indent=1)


if __name__ == "__main__":
    main()
