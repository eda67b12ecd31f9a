"""Acceptance of the embedded model on held-out code prompts (for the model card).

    python scripts/eval_embedded.py --prompts 12 --max-new-tokens 128

Prompts are windows of validation-split modules (files the backbone never
trained on) plus the app's demo prompts. Greedy decoding, default tree
("auto" = the tree shipped with the heads); also checks that every
speculative output equals plain greedy decoding token for token.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from specdec.train.medusa import corpus_prompts  # noqa: E402

DEMO = ["def fibonacci(n):", "class Stack:", "import os\n\ndef list_files(path):", "def quicksort(items):"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--heads", default=None)
    ap.add_argument("--prompts", type=int, default=12, help="held-out corpus prompts (plus the demo prompts)")
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tree", default="auto")
    ap.add_argument("--lookup", type=int, default=0, help="prompt-lookup tokens (0: the heads alone, the default here)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    loaded = specdec.load(a.model, a.heads)
    held = corpus_prompts(loaded.tokenizer, "valid", a.prompts, a.prompt_len, seed=123).tolist()
    prompts = [("valid", ids) for ids in held] + [("demo", loaded.tokenizer(p)["input_ids"]) for p in DEMO]
    rows = []
    for kind, ids in prompts:
        spec = specdec.generate(loaded, prompt_ids=ids, max_new_tokens=a.max_new_tokens, tree=a.tree,
                                lookup=a.lookup)
        plain = specdec.generate(loaded, prompt_ids=ids, max_new_tokens=a.max_new_tokens, speculative=False)
        rows.append({"kind": kind, "mean_accepted_length": spec.stats["mean_accepted_length"],
                     "identical": spec.token_ids == plain.token_ids, "new_tokens": spec.stats["new_tokens"]})
        print(f"{kind:5s} L={spec.stats['mean_accepted_length']:.2f} identical={rows[-1]['identical']}")
    held_rows = [r for r in rows if r["kind"] == "valid"]
    out = {"held_out_prompts": len(held_rows), "max_new_tokens": a.max_new_tokens, "tree": a.tree, "lookup": a.lookup,
           "mean_accepted_length_held_out": statistics.mean(r["mean_accepted_length"] for r in held_rows),
           "mean_accepted_length_demo": statistics.mean(r["mean_accepted_length"] for r in rows if r["kind"] == "demo"),
           "all_identical_to_plain_greedy": all(r["identical"] for r in rows), "rows": rows}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
