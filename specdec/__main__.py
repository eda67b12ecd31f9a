"""`python -m specdec generate --prompt "def fibonacci(n):" [options]`"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec", description="Lossless speculative decoding with Medusa heads.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text and print it (or JSON)")
    g.add_argument("--model", default=None, help="hub id or local path (default: the embedded model in assets/)")
    g.add_argument("--heads", default=None, help="heads folder, 'random', or omit (embedded heads for the default model)")
    g.add_argument("--prompt", default=None)
    g.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of --prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--tree", default="auto", help="auto, trained, chain, small, default or none (root only: prompt lookup drafts everything)")
    g.add_argument("--lookup", type=int, default=None,
                   help="prompt-lookup tokens drafted per round (0 = heads only; default 10, specdec.lookup.DEFAULT_LOOKUP)")
    g.add_argument("--lookup-mode", default="first", choices=["first", "merge"],
                   help="first: a round with an n-gram match drafts from lookup alone; merge: heads' tree + lookup")
    g.add_argument("--acceptance", default="auto", help="auto, greedy, lossless or typical (lossy)")
    g.add_argument("--no-speculation", action="store_true", help="plain autoregressive decoding (the baseline)")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default=None)
    g.add_argument("--json", action="store_true", help="print the full result (token_ids, text, stats, rounds) as JSON")
    a = ap.parse_args(argv)

    import specdec

    try:
        loaded = specdec.load(a.model, a.heads, device=a.device, dtype=a.dtype)
        ids = None
        if a.prompt_ids:
            ids = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
        res = specdec.generate(loaded, prompt=a.prompt, prompt_ids=ids, max_new_tokens=a.max_new_tokens,
                               temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                               seed=a.seed, tree=a.tree, speculative=not a.no_speculation,
                               acceptance=a.acceptance,
                               lookup=specdec.api.DEFAULT_LOOKUP if a.lookup is None else a.lookup,
                               lookup_mode=a.lookup_mode)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res.to_dict()))
    else:
        print((a.prompt or "") + res.text)
        s = res.stats
        print(f"\n[{s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
              f"mean accepted length {s['mean_accepted_length']:.2f}, {s['tokens_per_second']:.1f} tok/s]",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
