"""The embedded model's two drafters side by side: tokens per target forward on held-out prompts.

    python scripts/eval_drafters.py [--json assets/logs/eval_drafters.json]

Medusa heads and the EAGLE-3 drafter each draft on their shipped 16-node tree, with no prompt lookup,
over held-out corpus windows plus the app's demo prompts: greedy, and lossless sampling at T=0.7,
top-p 0.9 (one seed per prompt, the same for both). Tokens per target forward counts the bonus token
(prefill excluded). Greedy outputs are checked against plain decoding. A ratio of means over the same
prompts; the per-prompt figures go to the JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import specdec  # noqa: E402
from specdec.train.prompts import corpus_prompts  # noqa: E402

DEMO = ["def fibonacci(n):", "class Stack:", "import os\n\ndef list_files(path):", "def quicksort(items):"]
SAMPLED = dict(temperature=0.7, top_p=0.9)


def tau(loaded, ids, tokens: int, drafter: str, **kw) -> tuple[float, list[int], float]:
    """(tokens per target forward, tokens, seconds) of one request on the drafter's shipped tree, no lookup."""
    t0 = time.perf_counter()
    r = specdec.generate(loaded, prompt_ids=ids, max_new_tokens=tokens, eos_token_id=None, tree="trained", lookup=0,
                         drafter=drafter, **kw)
    dec = [e for e in r.rounds if e.index > 0]
    return sum(e.accepted_length for e in dec) / max(len(dec), 1), r.token_ids, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12, help="held-out corpus windows (plus the demo prompts)")
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    loaded = specdec.load()
    if loaded.heads is None or loaded.eagle is None:
        raise SystemExit("the embedded model needs both drafters (assets/heads and assets/eagle3)")
    tok = loaded.tokenizer
    prompts = corpus_prompts(tok, "valid", a.prompts, a.prompt_len, seed=123).tolist()
    prompts += [tok(p, add_special_tokens=False)["input_ids"] for p in DEMO]
    out: dict = {"prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "threads": torch.get_num_threads()}
    plain = [specdec.generate(loaded, prompt_ids=ids, max_new_tokens=a.max_new_tokens, eos_token_id=None,
                              speculative=False).token_ids for ids in prompts]
    for mode, kw in (("greedy", dict(temperature=0.0)), ("sampled", SAMPLED)):
        for drafter in ("medusa", "eagle3"):
            runs = [tau(loaded, ids, a.max_new_tokens, drafter, seed=i, **kw) for i, ids in enumerate(prompts)]
            key = f"{mode}_{drafter}"
            out[key] = {"tokens_per_forward": statistics.mean(r[0] for r in runs),
                        "per_prompt": [round(r[0], 3) for r in runs], "seconds": sum(r[2] for r in runs)}
            if mode == "greedy":
                out[key]["identical_to_plain"] = all(r[1] == p for r, p in zip(runs, plain))
        out[f"{mode}_ratio"] = out[f"{mode}_eagle3"]["tokens_per_forward"] / out[f"{mode}_medusa"]["tokens_per_forward"]
    print("| mode | Medusa heads | EAGLE-3 | EAGLE-3 / Medusa |\n| --- | ---: | ---: | ---: |")
    for mode in ("greedy", "sampled"):
        print(f"| {mode if mode == 'greedy' else 'T=0.7, top-p 0.9'} | {out[f'{mode}_medusa']['tokens_per_forward']:.2f} | "
              f"{out[f'{mode}_eagle3']['tokens_per_forward']:.2f} | {out[f'{mode}_ratio']:.2f}x |")
    print(f"greedy identical to plain: Medusa {out['greedy_medusa']['identical_to_plain']}, "
          f"EAGLE-3 {out['greedy_eagle3']['identical_to_plain']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
